"""The framework-agnostic core of a turn a framework's loop drives: its journal, replayed.

Each run of such a turn executes the framework's loop again from the start of the turn. The
adapter of the framework (``pydantic_ai``, ``openai_agents``) puts a :class:`Replay` between the
loop and the world:

- model request k is answered from the turn's k-th committed reply when there is one (after
  checking that the loop asks the same thing: ``brain.rules.foreign.diverged``); otherwise the
  agent's own model is asked for real (streamed, its pieces going to the live previews), and its
  reply is committed, with its Hands tool calls as intents, before the loop sees it
  (invariant 17);
- a Hands tool call returns its committed outcome; a reply whose calls have none yet left the
  turn waiting for them in its commit, and the run stops there (:class:`Suspended`): the Hands run
  them, and the run that the last outcome wakes replays up to the same point and goes on.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from brain.models.base import Message, OnDelta
from brain.models.openai_chat import unique_call_id
from brain.rules import foreign, moves
from brain.rules.agents import AgentDefinition
from brain.rules.calls import check_tool_calls
from brain.rules.messages import next_message
from brain.rules.states import TurnPhase, TurnStatus
from brain.run.calls import build_intents, refused_row, sent
from brain.run.context import BrainContext
from brain.run.interrupts import interrupted
from brain.store import Intent, TurnRow
from infra.process.logging import get_logger
from protocol import LimitReachedError, TendonError

log = get_logger(__name__)


class Suspended(Exception):
    """The run committed a move that leaves the framework's loop (the turn waits for its tools, or
    controls came): the loop is abandoned, and ``row`` is the turn as committed."""

    def __init__(self, row: TurnRow) -> None:
        super().__init__(f"turn {row.id} goes on in a later run")
        self.row = row


@dataclass
class Call:
    """A tool call of a live reply, as the framework made it."""

    framework_id: str
    tool: str
    args: dict[str, Any] | None  # None: not a JSON object (``error`` says why)
    error: str | None = None


@dataclass
class Live:
    """A reply the agent's own model just made, for the journal."""

    response: Any  # the framework's serialized reply (JSON), returned as it is on every replay
    text: str | None
    calls: list[Call]
    usage: dict[str, int]
    model: str | None = None


@dataclass
class _Reply:
    response: Any
    asked: str
    calls: dict[str, str]  # the framework's call id -> Tendon's


@dataclass
class Replay:
    """One run of a framework turn: the turn's committed replies and outcomes, and the commits of
    what the run adds to them."""

    ctx: BrainContext
    row: TurnRow
    agent: AgentDefinition
    bindings: dict[str, Any]
    history: list[Message]
    approvals: Collection[str] = ()  # tools the framework itself flags for approval
    replies: list[_Reply] = field(init=False)
    outcomes: dict[str, dict[str, Any]] = field(init=False)  # Tendon call id -> tool message
    asked_so_far: int = 0
    current: dict[str, str] = field(default_factory=dict)  # the last reply's call ids

    def __post_init__(self) -> None:
        mine = [m for m in self.history if m.turn_id == self.row.id]
        self.replies = [
            _recorded(m) for m in mine if m.role == "assistant" and foreign.FRAMEWORK_KEY in m.content
        ]
        self.outcomes = {m.content["call_id"]: m.content for m in mine if m.role == "tool"}

    @property
    def prior(self) -> list[Message]:
        """The thread's conversation before this turn."""
        return [m for m in self.history if m.turn_id != self.row.id]

    @property
    def prompt(self) -> str:
        """The turn's input, as the user gave it."""
        first = next((m for m in self.history if m.turn_id == self.row.id and m.role == "user"), None)
        return str(first.content.get("text", "")) if first is not None else ""

    @property
    def added(self) -> list[Message]:
        """What controls added to this turn so far (steers, injects), for the model's real
        requests: the framework's own messages never hold them, so replays stay as they were."""
        mine = [m for m in self.history if m.turn_id == self.row.id and m.role in ("user", "steer")]
        return mine[1:]

    async def ask(self, asked: str, live: Callable[[OnDelta | None], Awaitable[Live]]) -> Any:
        """The framework's reply to its next model request (``asked``: its digest): committed
        already, or made by ``live`` and committed now."""
        number = self.asked_so_far + 1
        self.asked_so_far = number
        if number <= len(self.replies):
            reply = self.replies[number - 1]
            error = foreign.diverged(self.agent.name, number, reply.asked, asked)
            if error is not None:
                raise error
            self.current = reply.calls
            return reply.response
        if self.row.pending:
            raise Suspended(self.row)  # controls came: they apply at this boundary
        if self.row.model_calls >= self.agent.limits.max_model_calls:
            raise LimitReachedError(
                f"the agent reached its limit of {self.agent.limits.max_model_calls} model calls in one turn"
            )
        self.ctx.killpoints.hit("brain.before_model_call", str(self.row.model_calls + 1))
        started = time.perf_counter()
        mid, attempt = next_message(self.row.id, self.row.model_calls, self.row.model_attempt)
        self.ctx.asked.add(self.row.id)  # a failure from here on supersedes this attempt
        try:
            made = await live(self.ctx.previews.sink(self.row.session_id, self.row.id, mid, attempt))
        except Exception:
            self.ctx.metrics.model_failed.observe(time.perf_counter() - started)
            raise
        elapsed = time.perf_counter() - started
        self.ctx.metrics.model_replied.observe(elapsed)
        call: dict[str, Any] = {"number": self.row.model_calls + 1, "latency_ms": round(elapsed * 1000, 1)}
        if made.model:
            call["model"] = made.model
        await self._commit(made, asked, call)
        return made.response

    async def _commit(self, made: Live, asked: str, call: dict[str, Any]) -> None:
        """Commit a live reply (with its Hands calls as intents); stop the run if the turn waits."""
        taken = {c for r in self.replies for c in r.calls.values()}
        routed, ids = [], {}
        for c in made.calls:
            if c.tool not in self.agent.tools:
                continue  # a local tool or the framework's own (its output tool): the framework's
            call_id = unique_call_id(c.framework_id, taken)
            taken.add(call_id)
            ids[c.framework_id] = call_id
            shown = {"call_id": call_id, "tool": c.tool, "args": c.args or {}}
            routed.append(shown | ({"error": c.error} if c.error else {}))
        message: dict[str, Any] = {"text": made.text}
        if routed:
            message["tool_calls"] = routed
        message[foreign.FRAMEWORK_KEY] = {
            "name": self.agent.framework, "response": made.response, "asked": asked, "calls": ids,
        }  # fmt: skip
        self.current = ids
        self.replies.append(_Reply(made.response, asked, ids))
        if not routed:
            move = foreign.went_on(self.row, message, made.usage, call)
            moved = await self.ctx.move(move)
            self.ctx.asked.discard(self.row.id)
            self.ctx.history.committed(self.row, moved.row, moved.seq, move.facts)
            self.ctx.killpoints.hit("brain.after_reply_commit", str(moved.row.model_calls))
            self._went(moved.row)
            return
        await self._commit_calls(message, made.usage, call, routed)

    async def _commit_calls(
        self,
        message: dict[str, Any],
        usage: dict[str, int],
        call: dict[str, Any],
        routed: list[dict[str, Any]],
    ) -> None:
        check_tool_calls(self.agent, self.history, self.row, len(routed))
        if self.approvals:  # the framework's own flags: the dispatch phase reads them here too
            message[foreign.FRAMEWORK_KEY]["approvals"] = sorted(self.approvals)
        approvals = [*self.agent.approvals, *self.approvals]
        intents: list[Intent] | None = None
        try:
            intents = await build_intents(
                self.ctx, self.row, self.bindings, routed, detailed=self.agent.journal == "detailed",
                approvals=approvals, trace=self.ctx.tracing.turn_parent(self.row.id),
            )  # fmt: skip
        except TendonError as exc:  # the reply is committed alone; the dispatch phase meets it again
            log.warning("intents_not_built", error=exc.message)
        move = moves.reply(
            self.row, message, usage, call=call, intents=intents, first_look=self.ctx.first_look
        )
        moved = await self.ctx.move(move)
        self.ctx.asked.discard(self.row.id)
        refused = {i.execution_id: refused_row(i) for i in intents or () if not i.sends}
        self.ctx.history.committed(self.row, moved.row, moved.seq, move.facts, refused)
        self.ctx.killpoints.hit("brain.after_reply_commit", str(moved.row.model_calls))
        if intents and await interrupted(self.ctx, moved.row):
            raise Suspended(moved.row)  # a new message interrupts the turn before its tools go out
        sent(self.ctx, intents or ())
        for execution in refused.values():  # refused by the Brain: their failures go back at once
            self.outcomes[execution["call_id"]] = execution
        self._went(moved.row)

    def _went(self, row: TurnRow) -> None:
        """The turn as the last commit left it: the loop goes on only while it runs here."""
        self.row = row
        going_on = row.status is TurnStatus.RUNNING and row.phase is TurnPhase.MODEL_REQUEST
        if not going_on or row.pending or self.ctx.draining:  # draining: this Brain stops at its commits
            raise Suspended(row)

    def outcome(self, framework_id: str, tool: str) -> dict[str, Any]:
        """The committed outcome of a Hands tool call of the last reply (as its tool message)."""
        call_id = self.current.get(framework_id)
        found = self.outcomes.get(call_id) if call_id else None
        if found is None:
            raise TendonError(f"no committed outcome for {tool} call {framework_id} of turn {self.row.id}")
        return found

    async def finish(self, text: str | None, output: Any) -> TurnRow:
        """Commit the framework's output as the turn's result."""
        move = foreign.finished(self.row, text, output)
        moved = await self.ctx.move(move)
        self.ctx.history.committed(self.row, moved.row, moved.seq, move.facts)
        return moved.row


def _recorded(message: Message) -> _Reply:
    kept = message.content[foreign.FRAMEWORK_KEY]
    return _Reply(kept["response"], kept["asked"], dict(kept.get("calls") or {}))


def tool_value(outcome: dict[str, Any]) -> Any:
    """What the framework's tool call returns for a committed outcome: the tool's result, or what
    went wrong (the model reads it as the tool's answer, as a native agent's model does). Its keys
    sorted: a result read back from PostgreSQL's JSONB has another order than the one the Hands
    reported, and the model must be asked the same thing in every run."""
    if outcome.get("status") == "succeeded":
        value = outcome.get("result")
    else:
        said = {k: outcome.get(k) for k in ("status", "error") if outcome.get(k) is not None}
        value = said | ({"result": outcome["result"]} if outcome.get("result") is not None else {})
    return json.loads(json.dumps(value, sort_keys=True))
