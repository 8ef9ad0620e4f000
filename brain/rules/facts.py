"""The facts a journal entry carries: one constructor per kind, so that each is spelled once.

A fact is a JSON object ``{"kind": ..., ...}``. An entry holds the facts of one commit about one
turn, in the order they happened; the entry itself says the status and phase the commit left
the turn in (the steps), and which run committed it.

==============================  ==========================================================
kind                            what happened
==============================  ==========================================================
``turn.accepted``               a submit: the request id and the user's input (and the schedule
                                that made it, saying whether it fired late)
``turn.run_started``            a claim: a new run (its number and epoch, the phase it began at,
                                the Brain that runs it)
``turn.prepared``               the turn's input went into its thread's conversation
``turn.waiting``                the turn waits (for tool bindings, or its executions): why
``turn.model_replied``          the model's reply (the assistant message) and its usage: the
                                message's durable, completed form, with its logical id
                                (``message_id``, the same for every attempt of that model call)
                                and the ``attempt`` that made it
``message.superseded``          an attempt of a model call ended without a reply (its run was
                                lost, or the call failed and is retried): whatever its previews
                                showed is void, a later attempt of the same ``message_id`` replaces it
``execution.intended``          a tool call committed as an execution, with its command
``execution.pending``           a call waits for a person: their approval, or a manual tool's
                                result (``awaits``: ``approval`` or ``result``)
``execution.<status>``          an execution's event applied (outcomes always; the others on
                                ``journal: detailed``)
``execution.output``            a tool's output as it came: the pages of one apply and attempt
                                (``offset``, ``size`` in bytes, ``text``, ``cut`` when the text
                                was cut short: the rest is read by offset from the output route)
``execution.output_gap``        a range of a tool's output that never came (``start``, ``end``)
``execution.reported_late``     Hands reported on an execution its turn settled already
``turn.results_applied``        a step's outcomes went into the conversation
``turn.retry_scheduled``        a run met a passing fault; the turn retries later
``turn.run_lost``               a run's Brain died or stopped before it committed its phase
``control.<status>``            a control was received, applied or rejected (with the reason)
``turn.input_added``            a steer or inject added input between two model steps
``turn.cancelled``              the turn ended by a cancel
``turn.rolled_back``            a new turn rolled this one back: its messages leave its thread's
                                conversation (its entries stay, for audit)
``turn.completed``              the turn's result (its last reply) is final
``turn.failed``                 the turn ended with an error
``execution.cancelled``         an open execution of a failed turn was settled
``batch.accepted``              a batch call's manifest was frozen (its tool, mode, limit, size)
``batch.progress``              a batch admitted children, skipped them (fail-fast) or ended:
                                how many are done, failed, in flight, not admitted yet
``turn.delegated``              a delegated call's child turn was accepted (its turn and thread)
``tool.delegated``              a delegated call was answered by its child's end (and its usage)
``tool.child_cancel_requested`` a cancel was asked of a child whose parent call ended (or whose
                                time budget ran out)
``thread.forked``               a new thread forked from another (``from``, its name) at journal seq
                                ``at``, snapped back to ``snapped_to``: the ``messages`` it starts with;
                                a copy of another session's (``from_session``) main thread likewise
``turn.webhook_failed``         a LangGraph run's webhook was given up after its last try (``run_id``,
                                ``url``, ``attempts``, the last ``error``)
``thread.rewound``              an idle thread's conversation set back to what it was at ``at``
                                (snapped back to ``snapped_to``): the ``messages`` it goes on from
==============================  ==========================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from brain.rules.states import ControlStatus, ExecutionStatus

Fact = dict[str, Any]

# Every kind a fact may have, as the stream's schema lists them (tests/test_stream_schema.py holds
# this list to the constructors below).
KINDS: tuple[str, ...] = (
    "turn.accepted", "turn.run_started", "turn.prepared", "turn.waiting", "turn.model_replied",
    "turn.results_applied", "turn.retry_scheduled", "turn.run_lost", "turn.input_added",
    "turn.cancelled", "turn.rolled_back", "turn.completed", "turn.failed", "message.superseded",
    "thread.forked", "thread.rewound", "turn.webhook_failed",
    "execution.intended", "execution.approved", "execution.output", "execution.output_gap",
    "execution.reported_late", "execution.input_required", "execution.input_given",
    "batch.accepted", "batch.progress",
    *(f"execution.{s}" for s in ExecutionStatus if s != ExecutionStatus.INTENDED),
    *(f"control.{s}" for s in ControlStatus),
    "turn.delegated", "tool.delegated", "tool.child_cancel_requested",
)  # fmt: skip


def accepted(request_id: str, text: str, schedule: dict[str, Any] | None = None) -> Fact:
    """``schedule``: the schedule that submitted the turn (its id, the time it was due, and when
    it fired late, how late and how many times it missed meanwhile)."""
    fact = {"kind": "turn.accepted", "request_id": request_id, "input": {"text": text}}
    return fact | ({"schedule": schedule} if schedule else {})


def run_started(run: int, epoch: int, phase: str, owner: str | None) -> Fact:
    return {"kind": "turn.run_started", "run": run, "epoch": epoch, "phase": phase, "owner": owner}


def prepared() -> Fact:
    return {"kind": "turn.prepared"}


def waiting(for_what: str) -> Fact:
    return {"kind": "turn.waiting", "waiting_for": for_what}


def model_replied(
    message: dict[str, Any],
    usage: dict[str, Any],
    call: dict[str, Any] | None = None,
    *,
    message_id: str | None = None,
    attempt: int = 1,
) -> Fact:
    """The reply, its token usage, and of the call that made it (``call``): its number in the
    turn, latency and the model that answered. ``message_id``: the message's logical id
    (``brain.rules.messages``), ``attempt``: which attempt of that model call replied."""
    fact: Fact = {"kind": "turn.model_replied", "message": message, "usage": usage}
    fact |= {"message_id": message_id, "attempt": attempt} if message_id else {}
    return fact | ({"call": call} if call else {})


def superseded(message_id: str, attempt: int, why: str) -> Fact:
    """Attempt ``attempt`` of the model call that makes ``message_id`` ended without a reply."""
    return {"kind": "message.superseded", "message_id": message_id, "attempt": attempt, "why": why}


def intended(execution_id: str, call_id: str, tool: str) -> Fact:
    return {"kind": "execution.intended", "execution_id": execution_id, "call_id": call_id, "tool": tool}


def results_applied(execution_ids: Sequence[str]) -> Fact:
    """The tool messages the model sees next are these executions' outcomes (read from their
    rows, where each is recorded once, not copied here)."""
    return {"kind": "turn.results_applied", "executions": list(execution_ids)}


def control(control_id: int, kind: str, status: str, reason: str | None = None) -> Fact:
    """A control was received (to be decided at the turn's next boundary), applied or rejected."""
    fact = {"kind": f"control.{status}", "control_id": control_id, "control": kind}
    return fact | ({"reason": reason} if reason else {})


def input_added(control_id: int, kind: str, text: str) -> Fact:
    """Input a steer or an inject added to the running turn, at a boundary between model steps."""
    return {"kind": "turn.input_added", "control_id": control_id, "control": kind, "text": text}


def cancelled_turn() -> Fact:
    return {"kind": "turn.cancelled"}


def rolled_back(by_turn: str) -> Fact:
    return {"kind": "turn.rolled_back", "by": by_turn}


def run_lost(run: int, phase: str, *, died: bool) -> Fact:
    """A run ended without committing its phase: its Brain died (or stopped). A model call it was
    making is lost: nothing of its reply is recorded, and its usage is not known."""
    return {"kind": "turn.run_lost", "run": run, "phase": phase, "how": "died" if died else "stopped"}


def retry_scheduled(retry: int, in_seconds: float, error: str) -> Fact:
    return {"kind": "turn.retry_scheduled", "retry": retry, "in_seconds": in_seconds, "error": error}


def completed() -> Fact:
    return {"kind": "turn.completed"}


def failed(error: dict[str, str]) -> Fact:
    return {"kind": "turn.failed", "error": error}


def cancelled(execution_id: str, call_id: str, tool: str, reason: str) -> Fact:
    return {"kind": "execution.cancelled", "execution_id": execution_id, "call_id": call_id, "tool": tool,
            "reason": reason}  # fmt: skip


def execution_event(status: str, execution_id: str, call_id: str, tool: str, **detail: Any) -> Fact:
    """An applied event of an execution: ``execution.<the status it moved to>``."""
    return {"kind": f"execution.{status}", "execution_id": execution_id, "call_id": call_id, "tool": tool,
            **detail}  # fmt: skip


def output(
    execution_id: str, call_id: str, tool: str, *, attempt: int, offset: int, size: int, text: str, cut: bool
) -> Fact:
    fact = {"kind": "execution.output", "execution_id": execution_id, "call_id": call_id, "tool": tool,
            "attempt": attempt, "offset": offset, "size": size, "text": text}  # fmt: skip
    return fact | ({"cut": True} if cut else {})


def input_required(execution_id: str, call_id: str, tool: str, key: str, message: str) -> Fact:
    """A running execution asks a person for input (an MCP task in ``input_required``)."""
    return {"kind": "execution.input_required", "execution_id": execution_id, "call_id": call_id,
            "tool": tool, "key": key, "message": message}  # fmt: skip


def input_given(execution_id: str, call_id: str, tool: str, key: str, decision: str) -> Fact:
    """A person answered it (``answer`` or ``decline``); the answer goes to its Hands."""
    return {"kind": "execution.input_given", "execution_id": execution_id, "call_id": call_id,
            "tool": tool, "key": key, "decision": decision}  # fmt: skip


def output_gap(execution_id: str, call_id: str, tool: str, start: int, end: int) -> Fact:
    return {"kind": "execution.output_gap", "execution_id": execution_id, "call_id": call_id, "tool": tool,
            "start": start, "end": end}  # fmt: skip


def reported_late(execution_id: str, call_id: str, tool: str, reported: str, how: str | None) -> Fact:
    fact = {"kind": "execution.reported_late", "execution_id": execution_id, "call_id": call_id, "tool": tool,
            "reported": reported}  # fmt: skip
    return fact | ({"how": how} if how else {})


def batch_accepted(execution_id: str, call_id: str, manifest: dict[str, Any]) -> Fact:
    """``manifest``: the batch's tool, mode, limit, on_failure and size (its items are the call's
    arguments, in the reply that made it)."""
    return {"kind": "batch.accepted", "execution_id": execution_id, "call_id": call_id, **manifest}


def batch_progress(
    execution_id: str, call_id: str, counts: dict[str, int], *, admitted: Sequence[str] = (),
    skipped: int = 0, ended: str | None = None,
) -> Fact:  # fmt: skip
    """``counts``: the children by where they stand (done, failed, in_flight, waiting);
    ``admitted``: the child executions this commit admitted; ``ended``: how the batch call ended."""
    fact = {"kind": "batch.progress", "execution_id": execution_id, "call_id": call_id, **counts}
    if admitted:
        fact["admitted"] = list(admitted)
    if skipped:
        fact["skipped"] = skipped
    return fact | ({"ended": ended} if ended else {})


def delegated(execution_id: str, call_id: str, tool: str, child: dict[str, Any]) -> Fact:
    """A delegated call's child turn was accepted: ``child`` names its turn, thread (the child's
    own entries are in the same session's stream) and agent."""
    return {"kind": "turn.delegated", "execution_id": execution_id, "call_id": call_id, "tool": tool,
            **child}  # fmt: skip


def tool_delegated(execution_id: str, call_id: str, tool: str, child_turn: str, status: str,
                   usage: dict[str, int]) -> Fact:  # fmt: skip
    """A delegated call took its child's end as its outcome; what the child spent."""
    return {"kind": "tool.delegated", "execution_id": execution_id, "call_id": call_id, "tool": tool,
            "child_turn": child_turn, "child_status": status, "usage": usage}  # fmt: skip


def child_cancel_requested(execution_id: str, child_turn: str, control_id: int, reason: str) -> Fact:
    return {"kind": "tool.child_cancel_requested", "execution_id": execution_id, "child_turn": child_turn,
            "control_id": control_id, "reason": reason}  # fmt: skip


def forked(
    from_thread: str,
    at: int,
    snapped_to: int,
    messages: list[dict[str, Any]],
    *,
    from_session: str | None = None,
) -> Fact:
    """The first entry of a fork: what it starts with (``brain.rules.forks.carried``); a copy's
    names the session it was copied from (``at`` is a seq of that session's journal)."""
    fact: Fact = {
        "kind": "thread.forked",
        "from": from_thread,
        "at": at,
        "snapped_to": snapped_to,
        "messages": messages,
    }
    if from_session is not None:
        fact["from_session"] = from_session
    return fact


def rewound(at: int, snapped_to: int, messages: list[dict[str, Any]]) -> Fact:
    return {"kind": "thread.rewound", "at": at, "snapped_to": snapped_to, "messages": messages}


def webhook_failed(run_id: str, url: str, attempts: int, error: str) -> Fact:
    return {"kind": "turn.webhook_failed", "run_id": run_id, "url": url, "attempts": attempts, "error": error}
