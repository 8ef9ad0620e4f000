"""Whether the Brain refuses a tool call as the model made it (a pure rule): a tool this thread has
no binding for, arguments that are not a JSON object, or arguments that fail the binding's JSON
Schema. ``brain.run.calls`` makes each call an intent, committed with the reply."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema

from brain.models.base import Message
from brain.rules.agents import AgentDefinition
from brain.rules.records import Intent, TurnRow
from protocol import LimitReachedError

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


def refused_intent(
    execution_id: str,
    step: int,
    call: Mapping[str, Any],
    binding: Mapping[str, Any],
    why: str,
    *,
    detailed: bool,
) -> Intent:
    """A call the Brain refuses: FAILED from the start, with the reason; nothing is sent, and the
    model is told as it is told a tool's failure."""
    return Intent(
        execution_id=execution_id, tool_step=step, call_id=call["call_id"], route=binding.get("route", "-"),
        tool=call["tool"], binding_digest=binding.get("digest", "-"),
        replay_policy=binding.get("replay_policy", "unsafe"), request_digest="-", command_message_id="-",
        command=None, queue="", journal_detail=detailed, status="failed",
        error={"code": "invalid_tool_call", "message": why},
    )  # fmt: skip


def manual_intent(
    execution_id: str, step: int, call: Mapping[str, Any], binding: Mapping[str, Any], *, detailed: bool
) -> Intent:
    """A call of a manual tool: PENDING until a person answers it; nothing is sent."""
    return Intent(
        execution_id=execution_id, tool_step=step, call_id=call["call_id"], route="manual", tool=call["tool"],
        binding_digest=binding["digest"], replay_policy="unsafe", request_digest="-", command_message_id="-",
        command=None, queue="", journal_detail=detailed, status="pending", awaits="result",
    )  # fmt: skip


def check_tool_calls(agent: AgentDefinition, history: Sequence[Message], row: TurnRow, asked: int) -> None:
    """Refuse a reply whose tool calls take the turn past the agent's limit."""
    mine = [m for m in history if m.role == "assistant" and m.turn_id == row.id]
    made = sum(len(m.content.get("tool_calls") or []) for m in mine)
    if made + asked > agent.limits.max_tool_calls:
        raise LimitReachedError(
            f"the agent reached its limit of {agent.limits.max_tool_calls} tool calls in one turn "
            f"(it asked for {asked} more after {made})"
        )
