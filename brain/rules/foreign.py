"""Rules of the turns a framework's loop drives (an agent definition of kind python: Pydantic AI,
the OpenAI Agents SDK), as pure functions: ``brain.frameworks`` does the I/O.

Such a turn is run by journal replay: every run executes the framework's loop again from the
start of the turn, and model request k is answered from the turn's k-th committed reply. What the
framework asks must be what it asked when that reply was made: the request's :func:`asked`
digest is committed with the reply and compared on replay (:func:`diverged`).

A committed reply moves the turn as a native one does (its Hands tool calls committed as
intents with it, and the turn waits for them), except a reply with no Hands tool calls: the
framework decides whether it ends the turn (its output may fail validation, or call a local
tool), so it is committed by :func:`went_on`, and the framework's output by :func:`finished`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from brain.rules import facts
from brain.rules.agents import AgentDefinition
from brain.rules.messages import next_message
from brain.rules.moves import move
from brain.rules.records import Move, TurnRow
from brain.rules.states import TurnPhase, TurnStatus
from protocol import ReplayDivergedError, SchemaError, digest

P, S = TurnPhase, TurnStatus

# What a framework's reply keeps beside Tendon's own message (``message["framework"]``).
FRAMEWORK_KEY = "framework"


def asked(request: Any) -> str:
    """The digest of what a model request asks (the framework's messages and tools, without the
    times and ids a new run makes anew)."""
    return digest({"request": request})


def diverged(agent: str, number: int, committed: str, now: str) -> ReplayDivergedError | None:
    """The error of a replayed model request that asks something else than the committed one."""
    if committed == now:
        return None
    return ReplayDivergedError(
        f"agent {agent} asked the model something different on replay at model call {number} of this "
        f"turn than when its reply was committed (digest {committed[:12]}, now {now[:12]}): the agent's "
        "code must be deterministic between model calls: no clock, random, environment or I/O in "
        "prompts, instructions or tool lists, and side effects only in tools (docs/frameworks.md)"
    )


def unplaced_tools(
    agent: str, tools: Mapping[str, Any], routed: list[str], local: list[str]
) -> SchemaError | None:
    """A tool of the framework's agent that the definition neither routes to the Hands (``tools``)
    nor runs in the Brain (``local_tools``): refused rather than guessed."""
    stray = sorted(t for t in tools if t not in routed and t not in local)
    if not stray:
        return None
    return SchemaError(
        f"agent {agent} has tool(s) {', '.join(stray)} that its definition places nowhere: list each in "
        "`tools` (run by a Hands pool) or, if it is pure, in `local_tools` (run in the Brain)"
    )


def approvals(agent: AgentDefinition, message: Mapping[str, Any]) -> list[str]:
    """The tools whose calls of ``message`` (a committed reply) wait for a person: the agent's
    ``approvals``, and those its framework flags itself (kept with the reply)."""
    return [*agent.approvals, *(message.get(FRAMEWORK_KEY) or {}).get("approvals", [])]


def went_on(row: TurnRow, message: dict[str, Any], usage: dict[str, Any], call: dict[str, Any]) -> Move:
    """A reply with no Hands tool call: committed, and the framework's loop goes on."""
    mid, attempt = next_message(row.id, row.model_calls, row.model_attempt)
    replied = facts.model_replied(message, usage, call, message_id=mid, attempt=attempt)
    return move(row, S.RUNNING, [], model_calls=row.model_calls + 1, model_attempt=0, facts=(replied,))


def finished(row: TurnRow, text: str | None, output: Any) -> Move:
    """The framework's loop returned its output: the turn's result."""
    result: dict[str, Any] = {"text": text}
    if output is not None and not isinstance(output, str):
        result["output"] = output
    return move(
        row, S.COMPLETED, [P.FINALIZE, P.DONE], release=True, result=result, facts=(facts.completed(),)
    )


def usage_of(input_tokens: int | None, output_tokens: int | None) -> dict[str, int]:
    """A framework's token counts as Tendon keeps a model call's usage."""
    usage = {"prompt_tokens": int(input_tokens or 0), "completion_tokens": int(output_tokens or 0)}
    return usage | {"total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}
