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

import jsonschema

from brain.run.context import BrainContext
from brain.store import Intent, TurnRow
from protocol import ExecuteBody, new_timed_id

# Compiled schema checkers by binding digest (which covers the schema: a binding's digest is
# checked against its fields when announced): compiling one was a third of building a call's
# intent. Bounded: emptied when full, then filled again by the bindings in use.
_CHECKERS: dict[str, jsonschema.Draft202012Validator] = {}
MAX_CHECKERS = 512


def _checker(binding: Mapping[str, Any]) -> jsonschema.Draft202012Validator:
    digest = binding.get("digest")
    if not isinstance(digest, str):  # nothing to know its schema by: compiled for this call
        return jsonschema.Draft202012Validator(binding["input_schema"])
    checker = _CHECKERS.get(digest)
    if checker is None:
        if len(_CHECKERS) >= MAX_CHECKERS:
            _CHECKERS.clear()
        checker = _CHECKERS[digest] = jsonschema.Draft202012Validator(binding["input_schema"])
    return checker


def refusal(call: Mapping[str, Any], bindings: Mapping[str, Any]) -> str | None:
    """Why the Brain refuses a tool call as the model made it, or None (a pure rule)."""
    if call.get("error"):
        return str(call["error"])
    binding = bindings.get(call["tool"])
    if binding is None:
        bound = ", ".join(sorted(bindings)) or "none"
        return f"there is no tool named {call['tool']!r} (the tools are: {bound})"
    try:
        error = jsonschema.exceptions.best_match(_checker(binding).iter_errors(call["args"]))
    except jsonschema.exceptions.SchemaError as exc:
        return f"the tool's schema cannot be checked: {exc.message}"
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"the arguments do not fit the tool's schema{f' at {where}' if where else ''}: {error.message}"


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
    command, sent once approved; a call of a manual tool is PENDING until a person answers it.
    ``trace``: the span the commands continue (carried to the Hands)."""
    intents = []
    for call in calls:
        execution_id = f"exe-{new_timed_id()}"
        why = refusal(call, bindings)
        binding = bindings.get(call["tool"]) or {}
        if why is None and binding.get("manual"):
            intents.append(
                Intent(
                    execution_id=execution_id, tool_step=row.tool_step + 1, call_id=call["call_id"],
                    route="manual", tool=call["tool"], binding_digest=binding["digest"],
                    replay_policy="unsafe", request_digest="-", command_message_id="-", command=None,
                    queue="", journal_detail=detailed, status="pending", awaits="result",
                )
            )  # fmt: skip
            continue
        if why is not None:
            intents.append(
                Intent(
                    execution_id=execution_id, tool_step=row.tool_step + 1, call_id=call["call_id"],
                    route=binding.get("route", "-"), tool=call["tool"],
                    binding_digest=binding.get("digest", "-"),
                    replay_policy=binding.get("replay_policy", "unsafe"), request_digest="-",
                    command_message_id="-", command=None, queue="", journal_detail=detailed, status="failed",
                    error={"code": "invalid_tool_call", "message": why},
                )
            )  # fmt: skip
            continue
        needs_approval = bool(binding.get("requires_approval")) or call["tool"] in approvals
        body = ExecuteBody(
            turn_id=row.id,
            call_id=call["call_id"],
            route=binding["route"],
            tool=binding["name"],
            binding_digest=binding["digest"],
            replay_policy=binding["replay_policy"],
            args=call["args"],
        )
        command = await ctx.codec.pack_execute(execution_id, row.namespace, row.session_id, body, trace)
        intents.append(
            Intent(
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
                status="pending" if needs_approval else "intended",
                awaits="approval" if needs_approval else None,
            )
        )
    return intents


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
