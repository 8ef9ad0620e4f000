"""What applying a run of sequenced events does to an execution, as pure functions.

The Brain applies an execution's events as a contiguous prefix (invariant 7; the arrival rules
are ``brain.rules.sequencing``). Once the events to apply are known, in order, :func:`effect` says what
they change: the execution's status (each step checked against the transition table), the
columns they set, the output pages they carry, the journal facts they record, and whether the
execution ended (which may wake its turn). The store's apply (``brain.store.executions``) plans
each execution's effect with it under the row's lock, on both backends.
"""

from __future__ import annotations

from collections.abc import Sequence
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


@dataclass(frozen=True)
class Execution:
    """What the journal says about an execution besides the event: who it is."""

    id: str
    call_id: str
    tool: str
    journal_detail: bool = False


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
    unknown_reason: str | None = None  # the turn then waits for a reconcile
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
    out = Effect(status=start, last_seq=events[0].seq - 1)
    for event in events:
        out.last_seq = event.seq
        body = event.body
        if event.kind == "output_page":
            out.pages.append((body.offset, body.data))
            continue
        new = EVENT_STATUS[event.kind]
        assert new is not None
        status = execution_transition(status, new)
        detail: dict[str, Any] = {}
        attempt = None
        if event.kind == "accepted":
            out.worker = body.worker
            detail["worker"] = body.worker
        elif event.kind == "started":
            out.attempts = attempt = body.attempt
            out.worker = body.worker
            detail.update(attempt=body.attempt, reason=body.reason, worker=body.worker)
        elif event.kind == "succeeded":
            out.outcome = {
                "result": body.result,
                "how": body.how,
                "evidence": body.evidence,
                "output_bytes": body.output_bytes,
                "error": None,
            }
            detail["how"] = body.how
        elif event.kind == "failed":
            out.outcome = {
                "result": None,
                "how": body.how,
                "evidence": body.evidence,
                "output_bytes": body.output_bytes,
                "error": body.error,
            }
            detail["how"] = body.how
        elif event.kind == "unknown":
            out.error = {"code": "unknown", "message": body.reason}
            out.unknown_reason = body.reason
            detail["reason"] = body.reason
        if journaled(event.kind, attempt, detail=execution.journal_detail):
            out.facts.append(
                facts.execution_event(status, execution.id, execution.call_id, execution.tool, **detail)
            )
    out.status = status
    return out


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
    "Effect",
    "Execution",
    "effect",
    "journaled",
    "late_note",
]
