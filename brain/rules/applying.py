"""What applying a run of sequenced events does to an execution, as pure functions.

The Brain applies an execution's events as a contiguous prefix (invariant 7; the arrival rules
are ``brain.rules.sequencing``). Once the events to apply are known, in order, :func:`effect` says what
they change: the execution's status (each step checked against the transition table), the
columns they set, the output pages they carry, the journal facts they record, and whether the
execution ended (which may wake its turn). The store's apply (``brain.store.executions``) plans
each execution's effect with it under the row's lock, on both backends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from brain.rules import facts
from brain.rules.states import (
    EVENT_STATUS,
    EXECUTION_TRANSITIONS,
    TERMINAL_EXECUTION,
    ExecutionStatus,
    execution_transition,
)

# The most text of a tool's output one journal fact carries (a stream reader reads the rest by offset).
OUTPUT_FACT_CHARS = 4096


@dataclass(frozen=True)
class Execution:
    """What the journal says about an execution besides the event: who it is."""

    id: str
    call_id: str
    tool: str
    journal_detail: bool = False
    attempt: int = 1  # the attempt running when these events come (a ``started`` says the next)
    output_bytes: int = 0  # how much of its output was applied before

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Execution:
        """From the execution's row as the store reads it."""
        return cls(row["id"], row["call_id"], row["tool"], bool(row["journal_detail"]),
                   attempt=row["attempts"] or 1, output_bytes=row["output_bytes"] or 0)  # fmt: skip


@dataclass
class Effect:
    """What a contiguous run of events does, applied from a given status."""

    status: ExecutionStatus
    last_seq: int
    attempts: int | None = None  # None: unchanged
    worker: str | None = None  # the Hands worker that accepted or started it (None: unchanged)
    outcome: dict[str, Any] | None = None  # result, how, evidence, output_bytes, error: all set together
    error: dict[str, Any] | None = None  # an UNKNOWN's reason (set without an outcome)
    pages: list[tuple[int, str]] = field(default_factory=list)  # (byte offset, data)
    output_end: int = 0  # the byte offset after the last output applied
    unknown_reason: str | None = None  # the turn then waits for a reconcile
    asked: dict[str, Any] | None = None  # an input_required: what it asks a person (key, message, requests)
    facts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_EXECUTION


def journaled(kind: str, attempt: int | None, *, detail: bool) -> bool:
    """Whether an applied event becomes a journal fact. What a tool came to (its outcome, or
    UNKNOWN) and a re-run after a crash always are; its acceptance, its first start and its
    output pages only for agents that ask for every step (``journal: detailed``)."""
    if detail:
        return kind != "output_page"
    if kind in ("accepted", "output_page"):
        return False
    if kind == "started":
        return (attempt or 1) > 1
    return True


def effect(start: ExecutionStatus, events: Sequence[Any], execution: Execution) -> Effect:
    """Apply ``events`` (contiguous, in seq order) from status ``start``.

    Raises IllegalTransitionError when one of them makes a move the table forbids; then
    nothing of the run may be written.
    """
    status = start
    out = Effect(status=start, last_seq=events[0].seq - 1, output_end=execution.output_bytes)
    output = OutputFacts(execution, out.output_end)
    for event in events:
        out.last_seq = event.seq
        body = event.body
        if event.kind == "output_page":
            out.pages.append((body.offset, body.data))
            out.facts += output.page(body.offset, body.data)
            continue
        if event.kind == "input_required":
            out.asked = body.model_dump(mode="json")
            x = execution
            out.facts.append(facts.input_required(x.id, x.call_id, x.tool, body.key, body.message))
            continue
        out.facts += output.flush()  # a tool's output is sealed before its outcome (invariant 8)
        new = EVENT_STATUS[event.kind]
        assert new is not None
        status = execution_transition(status, new)
        detail, attempt = _detail(event, out)
        if attempt is not None:
            output.attempt = attempt
        if journaled(event.kind, attempt, detail=execution.journal_detail):
            out.facts.append(
                facts.execution_event(status, execution.id, execution.call_id, execution.tool, **detail)
            )
    out.facts += output.flush()
    out.output_end = output.end
    out.status = status
    return out


def _detail(event: Any, out: Effect) -> tuple[dict[str, Any], int | None]:
    """What an event that moves the status sets on ``out``, and what its fact says besides the
    status (with the attempt a ``started`` begins)."""
    body = event.body
    detail: dict[str, Any] = {}
    attempt = None
    if event.kind == "accepted":
        out.worker = body.worker
        detail["worker"] = body.worker
    elif event.kind == "started":
        out.attempts = attempt = body.attempt
        out.worker = body.worker
        detail.update(attempt=body.attempt, reason=body.reason, worker=body.worker)
    elif event.kind in ("succeeded", "failed"):
        out.outcome = {
            "result": body.result if event.kind == "succeeded" else None,
            "how": body.how,
            "evidence": body.evidence,
            "output_bytes": body.output_bytes,
            "error": None if event.kind == "succeeded" else body.error,
        }
        detail["how"] = body.how
    elif event.kind == "unknown":
        out.error = {"code": "unknown", "message": body.reason}
        out.unknown_reason = body.reason
        detail["reason"] = body.reason
    return detail, attempt


class OutputFacts:
    """The journal facts of a tool's output: the pages of one apply and one attempt in one
    ``execution.output`` fact (its text cut at ``OUTPUT_FACT_CHARS``; all of it is readable by
    offset from the output route), and an ``execution.output_gap`` where a page starts beyond the
    end of what came before (a range that was lost is said, never silent: invariant 8)."""

    def __init__(self, execution: Execution, end: int) -> None:
        self._x = execution
        self.attempt = execution.attempt
        self.end = end  # the byte offset after the output applied so far
        self._first: int | None = None  # the offset of the first page not said yet
        self._text: list[str] = []
        self._bytes = 0
        self._gaps: list[dict[str, Any]] = []

    def page(self, offset: int, data: str) -> list[dict[str, Any]]:
        size = len(data.encode("utf-8"))
        if offset + size <= self.end:
            return []  # applied before (a replay from further back)
        said: list[dict[str, Any]] = []
        if offset > self.end:
            x = self._x
            said = self.flush() + [facts.output_gap(x.id, x.call_id, x.tool, self.end, offset)]
        if self._first is None:
            self._first = offset
        self._text.append(data)
        self._bytes += size
        self.end = offset + size
        return said

    def flush(self) -> list[dict[str, Any]]:
        if self._first is None:
            return []
        text = "".join(self._text)
        shown = text[:OUTPUT_FACT_CHARS]
        x = self._x
        fact = facts.output(x.id, x.call_id, x.tool, attempt=self.attempt, offset=self._first,
                            size=self._bytes, text=shown, cut=len(text) > len(shown))  # fmt: skip
        self._first, self._text, self._bytes = None, [], 0
        return [fact]


def late_note(status: str, earlier: dict[str, Any] | None, event: Any) -> dict[str, Any] | None:
    """The error a settled (CANCELLED) execution keeps when its Hands report an outcome after
    all: a cancel is only a request, and an operator must see that the tool acted (or did not).
    None when the event tells nothing to keep."""
    if status != ExecutionStatus.CANCELLED or event.kind not in (
        "succeeded",
        "failed",
        "cancelled",
        "unknown",
    ):
        return None
    how = getattr(event.body, "how", None)
    said = f"; afterwards its Hands reported it {event.kind}" + (f" ({how})" if how else "")
    if event.kind == "failed":
        said += f": {event.body.error.get('message')}"
    before = (earlier or {}).get("message", "its turn ended first")
    return {"code": str(status), "message": before + said}


__all__ = [
    "EXECUTION_TRANSITIONS",
    "OUTPUT_FACT_CHARS",
    "Effect",
    "OutputFacts",
    "Execution",
    "effect",
    "journaled",
    "late_note",
]
