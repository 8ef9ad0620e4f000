"""What becomes of the tool calls of a model's reply: an intent each, committed with the reply.

A call the Brain can check is checked here, before anything is sent: a tool this thread has no
binding for, arguments that are not a JSON object, or arguments that fail the binding's JSON
Schema make an execution that is FAILED from the start (how="rejected", with the reason). It
sends nothing, and goes back to the model as a failed tool result, so that a model that got a
call wrong can correct itself instead of crashing its turn. The others are INTENDED, with their
packed command, sent once the commit is done.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from brain.rules.batches import NAME as BATCH
from brain.rules.calls import manual_intent, refusal, refused_intent
from brain.rules.delegation import delegate_intent
from brain.rules.submits import shown_session
from brain.rules.waits import builtin_intent
from brain.run.batches import batch_intents
from brain.run.context import BrainContext
from brain.store import Intent, TurnRow
from protocol import ExecuteBody, new_timed_id


async def build_intents(
    ctx: BrainContext,
    row: TurnRow,
    bindings: Mapping[str, Any],
    calls: Sequence[Mapping[str, Any]],
    *,
    detailed: bool,
    approvals: Collection[str] = (),
    trace: str | None = None,
) -> list[Intent]:
    """An intent for every tool call: its execute command packed (a big one uploaded:
    content-addressed, so a crash here leaves at most an unreferenced object, never a reference
    to nothing), or FAILED with the reason the Brain refused it. A call that needs a person's
    approval (its binding says so, or the agent's ``approvals`` name its tool) is PENDING with its
    command, sent once approved; a call of a manual tool is PENDING until a person answers it, and
    one of a built-in wait until its clock, signal or approval does (``brain.rules.waits``); a
    batch call is its own intent and one per item (``brain.run.batches``).
    ``trace``: the span the commands continue (carried to the Hands)."""
    intents = []
    for call in calls:
        execution_id, step = f"exe-{new_timed_id()}", row.tool_step + 1
        why = refusal(call, bindings)
        binding = bindings.get(call["tool"]) or {}
        if why is not None:
            intents.append(refused_intent(execution_id, step, call, binding, why, detailed=detailed))
        elif binding.get("builtin") and call["tool"] == BATCH:  # brain.run.batches
            intents += await batch_intents(
                ctx, row, execution_id, call, bindings, detailed=detailed, approvals=approvals, trace=trace,
                pack=_sent,
            )  # fmt: skip
        elif binding.get("delegate"):
            intents.append(delegate_intent(execution_id, step, call, binding, detailed=detailed))
        elif binding.get("builtin"):
            intents.append(builtin_intent(execution_id, step, call, detailed=detailed))
        elif binding.get("manual"):
            intents.append(manual_intent(execution_id, step, call, binding, detailed=detailed))
        else:
            approval = bool(binding.get("requires_approval")) or call["tool"] in approvals
            intents.append(
                await _sent(
                    ctx, row, execution_id, call, binding, detailed=detailed, approval=approval, trace=trace
                )
            )
    return intents


async def _sent(
    ctx: BrainContext,
    row: TurnRow,
    execution_id: str,
    call: Mapping[str, Any],
    binding: Mapping[str, Any],
    *,
    detailed: bool,
    approval: bool,
    trace: str | None,
) -> Intent:
    """The intent of a call the Brain sends to its route (once approved, when it needs that)."""
    body = ExecuteBody(
        turn_id=row.id,
        call_id=call["call_id"],
        route=binding["route"],
        tool=binding["name"],
        binding_digest=binding["digest"],
        replay_policy=binding["replay_policy"],
        args=call["args"],
    )
    session = shown_session(row.namespace, row.session_id)  # the id the Hands know (not the key)
    command = await ctx.codec.pack_execute(execution_id, row.namespace, session, body, trace)
    return Intent(
        execution_id=execution_id,
        tool_step=row.tool_step + 1,
        call_id=call["call_id"],
        route=binding["route"],
        tool=binding["name"],
        binding_digest=binding["digest"],
        replay_policy=binding["replay_policy"],
        request_digest=command["request_digest"],
        command_message_id=command["message_id"],
        command=command.raw,
        queue=ctx.topology.commands(binding["route"]),
        journal_detail=detailed,
        status="pending" if approval else "intended",
        awaits="approval" if approval else None,
    )


def refused_row(intent: Intent) -> dict[str, Any]:
    """The execution row a refused call was committed as (what its tool message is made of)."""
    return {
        "id": intent.execution_id, "call_id": intent.call_id, "tool": intent.tool, "status": intent.status,
        "result": None, "error": intent.error, "how": "rejected",
    }  # fmt: skip


def sent(ctx: BrainContext, intents: Sequence[Intent]) -> None:
    """After the intents' commit: their commands go out (from memory)."""
    for intent in intents:
        ctx.killpoints.hit("brain.after_intent_commit", intent.call_id)
    ctx.commands.send([(i.queue, i.command, i.command_message_id) for i in intents if i.sends and i.command])
    if any(i.awaits == "child" for i in intents):
        ctx.delegations.set()  # its child is accepted at once, not at the loop's next period
