"""Delegation to child turns (a pure rule): a tool of the parent agent that starts a turn of
another agent, in a child thread of the same session, and whose result is that turn's answer.

An agent definition declares its delegates by tool name::

    "delegates": {"research": {"agent": {...a whole agent definition...}, "thread": "per-call",
                  "budget": {"model_calls": 5, "tool_calls": 10, "tokens": 20000, "seconds": 120},
                  "on_budget": "partial"}}

The child's definition is part of the parent's, so the version a parent thread froze pins its
children's too. The model sees each delegate as a tool with one ``input`` string. A call of one is
a PENDING execution (``awaiting_child``) the Brain answers itself: its delegation loop accepts the
child turn, creating the child thread and recording the parent-child mapping in the same commit
(invariant 19), and settles the call with the child's answer once the child ended.

=============  ================================================================================
field          meaning
=============  ================================================================================
``thread``     ``per-call`` (default): a new child thread per call; a name: that thread of the
               session, kept across calls (the child keeps its context)
``budget``     what the child may spend: model calls, tool calls, tokens, wall-clock seconds
               (each optional); checked before each of its model calls, and the seconds also by
               the loop while it waits
``on_budget``  ``fail`` (default): the child fails, and the call with it; ``partial``: the child
               ends with what it has (its last reply's text, ``partial: true``)
=============  ================================================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from brain.rules.names import check_thread_name
from brain.rules.records import Intent
from protocol import SchemaError, digest

if TYPE_CHECKING:
    from brain.rules.agents import AgentDefinition

ROUTE = "brain"  # answered by the Brain itself, as the built-in waits are
PER_CALL = "per-call"
AWAITING = "awaiting_child"  # the ``how`` of a call whose child runs (or is about to start)
# ``wait_key`` of a delegated call whose child is not accepted yet: what the loop finds new calls
# by (a small partial index; cleared when the child starts, so it holds only the calls to start).
TO_START = "delegate"
REQUEST_PREFIX = "delegate:"  # a child turn's request id: this plus its parent call's execution id
_AGENT = "the delegate's agent definition (name, version, model, tools...): a whole one, pinned with this"
_INPUT_SCHEMA = {
    "type": "object",
    "properties": {"input": {"type": "string", "minLength": 1, "description": "what to ask the delegate"}},
    "required": ["input"],
    "additionalProperties": False,
}


class DelegationStatus(StrEnum):
    """Where a delegated call's record stands (its first status is one of running, refused and
    never_started)."""

    RUNNING = "running"  # its child was accepted and has not ended
    OVER_BUDGET = "over_budget"  # its child's time budget ran out: a cancel was asked of it
    SETTLED = "settled"  # the call took its child's end
    REFUSED = "refused"  # no child: a cycle, or the child's thread refused it
    NEVER_STARTED = "never_started"  # no child: the call ended (its turn cancelled) first


_D = DelegationStatus
DELEGATION_TRANSITIONS: dict[DelegationStatus, frozenset[DelegationStatus]] = {
    _D.RUNNING: frozenset({_D.OVER_BUDGET, _D.SETTLED}),
    _D.OVER_BUDGET: frozenset({_D.SETTLED}),
    _D.SETTLED: frozenset(),
    _D.REFUSED: frozenset(),
    _D.NEVER_STARTED: frozenset(),
}
OPEN_DELEGATION = frozenset(s for s, targets in DELEGATION_TRANSITIONS.items() if targets)


class Budget(BaseModel):
    """What a child turn may spend at most (None: no bound of that kind)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_calls: int | None = Field(default=None, ge=1)
    tool_calls: int | None = Field(default=None, ge=0)
    tokens: int | None = Field(default=None, ge=1)
    seconds: float | None = Field(default=None, gt=0)


def _agent_as_object(schema: dict[str, Any]) -> None:
    schema["properties"]["agent"] = {"type": "object", "description": _AGENT}


class Delegate(BaseModel):
    """One delegate tool of an agent: the agent it runs, in which thread, with what budget."""

    # Its schema says "an object", not the definition again: a schema that contains itself cannot
    # be written out in place (the submit route's OpenAPI entry), and the definition is checked all
    # the same when read. (Not with WithJsonSchema on the field: on a type that refers to itself,
    # pydantic then gives the whole AgentDefinition that schema once FastAPI wrote its document.)
    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra=_agent_as_object)

    agent: AgentDefinition
    description: str = ""
    thread: str = PER_CALL
    budget: Budget = Budget()
    on_budget: Literal["fail", "partial"] = "fail"

    @field_validator("thread")
    @classmethod
    def _thread_name(cls, value: str) -> str:
        if value != PER_CALL:
            try:
                check_thread_name(value)
            except SchemaError as exc:  # said as the definition's own error, where it is
                raise ValueError(exc.message) from exc
        return value

    def binding(self, name: str) -> dict[str, Any]:
        """What a thread freezes for it, beside the Hands pools' bindings."""
        about = self.description or f"Ask agent {self.agent.name} (it answers with its result)."
        fields = {"name": name, "description": about, "input_schema": _INPUT_SCHEMA}
        return {
            **fields,
            "version": f"delegate:{self.agent.name}:{self.agent.version}",
            "route": ROUTE,
            "replay_policy": "safe",
            "delegate": True,
            "digest": digest({**fields, "agent": self.agent.digest}),
        }


def bindings(delegates: Mapping[str, Delegate]) -> dict[str, dict[str, Any]]:
    return {name: d.binding(name) for name, d in delegates.items()}


def delegate_intent(
    execution_id: str, step: int, call: Mapping[str, Any], binding: Mapping[str, Any], *, detailed: bool
) -> Intent:
    """A delegate's call: PENDING until its child ends; nothing is sent anywhere."""
    return Intent(
        execution_id=execution_id,
        tool_step=step,
        call_id=call["call_id"],
        route=ROUTE,
        tool=call["tool"],
        binding_digest=binding["digest"],
        replay_policy="safe",
        request_digest="-",
        command_message_id="-",
        command=None,
        queue="",
        journal_detail=detailed,
        status="pending",
        awaits="child",
        wait_key=TO_START,
    )


def child_thread(delegate: Delegate, execution_id: str) -> str:
    """The name of the child's thread: the delegate's own, or one for this call alone."""
    return f"d-{execution_id}" if delegate.thread == PER_CALL else delegate.thread


def child_request(execution_id: str) -> str:
    """The child turn's request id: a second accept of the same call finds the first turn."""
    return f"{REQUEST_PREFIX}{execution_id}"


def cycle(chain: Sequence[Mapping[str, str]], thread_id: str, agent: str) -> str | None:
    """Why a child in ``thread_id`` running ``agent`` is refused, or None. ``chain``: the threads
    and agents from the root turn down to the parent (the parent last). A thread of the chain would
    wait on itself (its open turn waits for a child queued behind it), and an agent already in the
    chain would delegate to itself again, without end."""
    for link in chain:
        if link["thread"] == thread_id:
            return f"a cycle: thread {link['thread_name']!r} would wait on itself through its children"
        if link["agent"] == agent:
            path = " -> ".join([*(str(x["agent"]) for x in chain), agent])
            return f"a cycle: agent {agent} delegates to itself through its children ({path})"
    return None


def used(entries_facts: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """What a turn spent so far, from its journal facts: model calls (replied), tool calls asked,
    and tokens (``total_tokens``, else prompt plus completion, of each reply's usage)."""
    spent = {"model_calls": 0, "tool_calls": 0, "tokens": 0}
    for f in entries_facts:
        if f.get("kind") != "turn.model_replied":
            continue
        spent["model_calls"] += 1
        spent["tool_calls"] += len((f.get("message") or {}).get("tool_calls") or [])
        spent["tokens"] += tokens(f.get("usage") or {})
    return spent


def tokens(usage: Mapping[str, Any]) -> int:
    if isinstance(usage.get("total_tokens"), int):
        return int(usage["total_tokens"])
    return sum(
        int(usage.get(k) or 0)
        for k in ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")
    )


def spent(budget: Budget, spent_so_far: Mapping[str, int], elapsed: float) -> str | None:
    """Which bound of ``budget`` is reached before another model call (in words), or None."""
    for kind in ("model_calls", "tool_calls", "tokens"):
        bound = getattr(budget, kind)
        if bound is not None and spent_so_far[kind] >= bound:
            return f"its budget of {bound} {kind.replace('_', ' ')} is spent ({spent_so_far[kind]} used)"
    if budget.seconds is not None and elapsed >= budget.seconds:
        return f"its budget of {budget.seconds:g} seconds is spent"
    return None


def partial_result(
    last_text: str | None, why: str, executions: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """A child's result when its budget ended it with what it had: its last reply's text and the
    outcomes of the tool calls it made."""
    results = [
        {"tool": e["tool"], "call_id": e["call_id"], "status": e["status"], "result": e["result"]}
        for e in executions
    ]
    return {"text": last_text or "", "partial": True, "reason": why, "results": results}


def answer(
    child_status: str,
    result: Any,
    error: Any,
    *,
    stopped: str | None = None,
    on_budget: str = "fail",
    last_text: str | None = None,
    executions: Sequence[Mapping[str, Any]] = (),
) -> tuple[str, str, Any, Any]:
    """What a child's end makes of its parent's call: (status, how, result, error). ``stopped``:
    why the delegation cancelled the child itself (its time budget), if it did; then it ends as
    ``on_budget`` says, with ``last_text`` (its last reply's) for a partial result."""
    if stopped is not None and child_status == "cancelled":
        if on_budget == "partial":
            return "succeeded", "partial", partial_result(last_text, stopped, executions), None
        return (
            "failed",
            "delegated",
            None,
            {"code": "limit_reached", "message": f"the child turn stopped: {stopped}"},
        )
    if child_status == "completed":
        how = "partial" if isinstance(result, Mapping) and result.get("partial") else "delegated"
        return "succeeded", how, result, None
    if child_status == "failed":
        message = error.get("message") if isinstance(error, Mapping) else None
        return (
            "failed",
            "delegated",
            None,
            {"code": "child_failed", "message": f"the child turn failed: {message}"},
        )
    return "failed", "delegated", None, {"code": "child_cancelled", "message": "the child turn was cancelled"}


def last_text(said: Sequence[Mapping[str, Any]]) -> str | None:
    """The text of the last reply that had some, from a turn's facts."""
    texts = [(f.get("message") or {}).get("text") for f in said if f.get("kind") == "turn.model_replied"]
    return next((t for t in reversed(texts) if t), None)
