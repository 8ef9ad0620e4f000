"""Where a turn goes next, as pure functions: each takes the turn as its run knows it (and what it
read or heard) and returns the :class:`Move` its run commits, checked against the state tables.

The store commits many moves together; a move is refused whole if the turn is no longer as its
run knew it. Phases that only touch the database (prepare, the wait check, applying results,
finalize) are taken in the commit that reaches them, so a turn costs one commit per model step
and one per wake-up, while every commit still moves it from one committed phase to another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from brain.rules import facts
from brain.rules.messages import next_message
from brain.rules.records import Intent, Move, TurnRow
from brain.rules.states import (
    TERMINAL_EXECUTION,
    ExecutionStatus,
    TurnPhase,
    TurnStatus,
    phase_transition,
    turn_transition,
)

P, S = TurnPhase, TurnStatus


def _checked(row: TurnRow, status: TurnStatus, path: Sequence[TurnPhase]) -> None:
    """Check a move along ``path`` (the phases passed through, ending where it stops)."""
    for a, b in zip([row.phase, *path], path, strict=False):
        if a != b or a in (P.PREPARE, P.WAIT_TOOLS):  # those two may stay where they are
            phase_transition(a, b)
    if status != row.status:
        turn_transition(row.status, status)


def move(row: TurnRow, status: TurnStatus, path: Sequence[TurnPhase], **values: Any) -> Move:
    _checked(row, status, path)
    return Move(before=row, status=status, phase=path[-1] if path else row.phase, **values)


def started(row: TurnRow) -> dict[str, Any]:
    """The fact of the run this claim began (``row`` as the claim left it)."""
    return facts.run_started(row.runs, row.lease_epoch, str(row.phase), row.lease_owner)


def resume(row: TurnRow) -> Move:
    """A claimed turn whose next step is a model call or a dispatch: only the run is journaled."""
    return move(row, S.RUNNING, [], facts=(started(row),))


def prepare(row: TurnRow, *, freeze: dict[str, Any] | None) -> Move:
    """The turn's input joins its thread's conversation; ``freeze``: the bindings the thread
    keeps from now on, when this is its first turn."""
    return move(row, S.RUNNING, [P.MODEL_REQUEST], freeze=freeze, facts=(started(row), facts.prepared()))


def wait_for_bindings(row: TurnRow, missing: Sequence[str], seconds_left: float) -> Move:
    """No Hands pool announced some of the agent's tools yet: the turn waits as a row, woken by an
    announcement or at the deadline."""
    reason = f"a Hands pool to announce {', '.join(missing)}"
    return move(
        row, S.WAITING, [P.PREPARE], release=True, waiting_for=reason, wake_in=max(0.0, seconds_left),
        facts=(started(row), facts.waiting(reason)),
    )  # fmt: skip


def all_final(executions: Sequence[Mapping[str, Any]]) -> bool:
    return bool(executions) and all(ExecutionStatus(e["status"]) in TERMINAL_EXECUTION for e in executions)


def waiting_reason(executions: Sequence[Mapping[str, Any]]) -> str:
    pending = [e for e in executions if ExecutionStatus(e["status"]) not in TERMINAL_EXECUTION]
    unknown = [e for e in pending if e["status"] == ExecutionStatus.UNKNOWN]
    if unknown:
        return f"reconcile of {len(unknown)} UNKNOWN execution(s): " + ", ".join(
            f"{e['id']} ({e['tool']} {e['call_id']})" for e in unknown
        )
    return f"{len(pending)} tool execution(s)"


def wait_check(row: TurnRow, executions: Sequence[Mapping[str, Any]], *, first_look: float) -> Move:
    """A woken (or resumed) turn in WAIT_TOOLS: its results go to the model if every execution of
    its step is final, else it waits again."""
    if all_final(executions):
        return apply_results(row, executions, via_wait=True)
    reason = waiting_reason(executions)
    return move(
        row, S.WAITING, [P.WAIT_TOOLS], release=True, waiting_for=reason, wake_in=first_look,
        facts=(started(row), facts.waiting(reason)),
    )  # fmt: skip


def apply_results(row: TurnRow, executions: Sequence[Mapping[str, Any]], *, via_wait: bool = False) -> Move:
    path = [P.APPLY_RESULTS, P.MODEL_REQUEST] if via_wait else [P.MODEL_REQUEST]
    applied = facts.results_applied([e["id"] for e in executions])
    return move(row, S.RUNNING, path, facts=(started(row), applied))


def reply(
    row: TurnRow,
    message: dict[str, Any],
    usage: dict[str, Any],
    *,
    call: dict[str, Any] | None = None,
    intents: Sequence[Intent] | None,
    first_look: float,
) -> Move:
    """The model's reply, with what follows from it: its tool calls committed as executions (the
    turn then waits for them), or, without calls, the turn's result. ``intents`` None for a reply
    with calls whose commands could not be built: the reply is committed alone, and the dispatch
    phase meets the problem again."""
    mid, attempt = next_message(row.id, row.model_calls, row.model_attempt)
    replied = [facts.model_replied(message, usage, call, message_id=mid, attempt=attempt)]
    calls = message.get("tool_calls") or []
    model_calls = row.model_calls + 1
    if calls and intents is not None:
        replied += intent_facts(intents)
        if all(i.status == ExecutionStatus.FAILED for i in intents):
            # The Brain refused every call itself: their failures go to the model at once.
            replied.append(facts.results_applied([i.execution_id for i in intents]))
            return move(
                row, S.RUNNING, [P.DISPATCH_TOOLS, P.WAIT_TOOLS, P.APPLY_RESULTS, P.MODEL_REQUEST],
                model_calls=model_calls, model_attempt=0, tool_step=row.tool_step + 1, facts=tuple(replied),
                intents=tuple(intents),
            )  # fmt: skip
        return move(
            row, S.WAITING, [P.DISPATCH_TOOLS, P.WAIT_TOOLS], release=True, model_calls=model_calls,
            model_attempt=0, tool_step=row.tool_step + 1, waiting_for=intents_reason(intents),
            wake_in=first_look, facts=tuple(replied), intents=tuple(intents),
        )  # fmt: skip
    if calls:
        return move(
            row, S.RUNNING, [P.DISPATCH_TOOLS], model_calls=model_calls, model_attempt=0, facts=tuple(replied)
        )
    replied.append(facts.completed())
    return move(
        row, S.COMPLETED, [P.FINALIZE, P.DONE], release=True, model_calls=model_calls, model_attempt=0,
        result={"text": message.get("text")}, facts=tuple(replied),
    )  # fmt: skip


def intents_reason(intents: Sequence[Intent]) -> str:
    """What a turn that just committed these waits for."""
    parts = []
    sent = sum(1 for i in intents if i.sends)
    if sent:
        parts.append(f"{sent} tool execution(s)")
    for i in intents:
        if i.awaits == "approval":
            parts.append(f"approval of {i.tool} {i.call_id}")
        elif i.awaits == "result":
            parts.append(f"a person's result for {i.tool} {i.call_id}")
        elif i.awaits == "clock":
            parts.append(f"{i.tool} {i.call_id} to end ({i.wait_seconds:g} s)")
        elif i.awaits == "child":
            parts.append(f"a child turn for {i.tool} {i.call_id}")
        elif i.awaits == "signal":
            until = f" (at most {i.wait_seconds:g} s)" if i.wait_seconds is not None else ""
            parts.append(f"signal {i.wait_key} for {i.call_id}{until}")
        elif i.awaits == "batch" and i.batch is not None:
            parts.append(f"batch {i.call_id} ({len(i.batch['items'])} calls of {i.batch['tool']})")
    return "; ".join(parts) or "nothing"


def dispatch(row: TurnRow, intents: Sequence[Intent], *, first_look: float) -> Move:
    """A reply's tool calls, committed after the reply itself (a run that resumed at DISPATCH)."""
    return move(
        row, S.WAITING, [P.WAIT_TOOLS], release=True, tool_step=row.tool_step + 1,
        waiting_for=intents_reason(intents), wake_in=first_look,
        facts=tuple(intent_facts(intents)), intents=tuple(intents),
    )  # fmt: skip


def intent_facts(intents: Sequence[Intent]) -> list[dict[str, Any]]:
    """What the journal says of a step's intents: each one committed, then those that are not
    sent at once and why. A call the Brain refused failed from the start (how="rejected"); a
    call that waits for a person's approval, or for a person's result (a manual tool), is
    PENDING: it has not failed, and nothing was refused."""
    said = [facts.intended(i.execution_id, i.call_id, i.tool) for i in intents]
    for i in intents:
        if i.status == ExecutionStatus.FAILED:
            said.append(facts.execution_event("failed", i.execution_id, i.call_id, i.tool, how="rejected"))
        elif i.batch is not None:  # its children wait for admission as part of it
            said.append(
                facts.batch_accepted(
                    i.execution_id,
                    i.call_id,
                    {k: v for k, v in i.batch.items() if k not in ("items", "binding")},
                )
            )
        elif i.awaits is not None and i.awaits != "admission":
            said.append(facts.execution_event("pending", i.execution_id, i.call_id, i.tool, awaits=i.awaits))
    return said


def finalize(row: TurnRow, last_message: dict[str, Any]) -> Move:
    """A run that resumed at FINALIZE: the last reply is the turn's result."""
    return move(
        row, S.COMPLETED, [P.DONE], release=True, result={"text": last_message.get("text")},
        facts=(started(row), facts.completed()),
    )  # fmt: skip


def retry(row: TurnRow, *, retries: int, delay: float, error: str, asked: bool = False) -> Move:
    """A run met a passing fault: the turn is due again after ``delay`` seconds (persisted
    backoff), its lease given up. ``asked``: the fault ended a model call that had begun (whose
    previews may have been shown): that attempt is superseded, and the next one counts on."""
    noted = [facts.retry_scheduled(retries, delay, error)]
    if not asked:
        return move(row, S.RUNNING, [], release=True, retries=retries, wake_in=delay, facts=tuple(noted))
    mid, attempt = next_message(row.id, row.model_calls, row.model_attempt)
    noted.append(facts.superseded(mid, attempt, f"the model call failed and is asked again: {error}"))
    return move(
        row, S.RUNNING, [], release=True, retries=retries, wake_in=delay, model_attempt=attempt,
        facts=tuple(noted),
    )  # fmt: skip


def hand_back(row: TurnRow) -> Move:
    """Controls came while this run held the turn: it gives the lease back, and the claim that
    takes the turn next applies them at this boundary."""
    return move(row, S.RUNNING, [], release=True, wake_in=0.0)


def pause(row: TurnRow, said: Sequence[dict[str, Any]]) -> Move:
    """A pause reached the turn's boundary: it stops here until a resume."""
    return move(row, S.PAUSED, [], release=True, waiting_for="a resume", facts=(started(row), *said))


def cancel(row: TurnRow, said: Sequence[dict[str, Any]]) -> Move:
    """A cancel whose executions are all settled (or that had none): the turn ends."""
    return move(row, S.CANCELLED, [], release=True, facts=(started(row), *said, facts.cancelled_turn()))


def wait_for_cancel(row: TurnRow, unsettled: int) -> Move:
    """A cancelling turn whose executions are not all settled yet waits for them."""
    reason = f"{unsettled} execution(s) to settle after a cancel"
    return move(
        row, S.WAITING, [], release=True, waiting_for=reason, facts=(started(row), facts.waiting(reason))
    )
