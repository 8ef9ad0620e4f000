"""The delegation loop (``brain.rules.delegation``): every Brain looks, every scan interval, for
delegated calls whose child is to be accepted, children that ended, and children whose parent's
call ended first (or whose time budget ran out).

- A child is accepted in one commit with its record and its thread (invariant 19): the call's row
  locked (another Brain skips it), refused if it would make a cycle, else the child turn accepted
  (queued for any Brain's claim, under a request id made of the call's execution id) and the
  record written. A call that ended before (its turn cancelled) gets a record with no child: no
  child starts late.
- A child that ended answers its parent's call in one commit (its result, or its error), which
  wakes the parent turn as any result does, and says what the child spent.
- A child whose parent's call ended (the parent turn cancelled or failed), or whose time budget ran
  out, is cancelled through its own cancel (its running tools with it), by a control whose request
  id is made of the call's: asking again is asking once. Pausing a parent pauses no child.

A child's model-call, tool-call and token budgets are checked by its own run, before each model
call (:func:`over_budget`).
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from brain.rules import delegation as rules
from brain.rules import facts, moves
from brain.rules.delegation import DelegationStatus as Status
from brain.rules.states import TurnPhase, TurnStatus
from brain.rules.submits import Submit, shown_session, thread_id
from brain.run.context import BrainContext
from brain.store import TurnRow
from infra.db import Connection, Json
from infra.db.store import as_time
from infra.process.logging import get_logger
from infra.process.loops import BackgroundLoop
from protocol import LimitReachedError, TendonError

log = get_logger(__name__)

BATCH = 100  # records looked at per commit at most; the rest in the next pass
# Cancel a turn (namespace, turn id, request id) through the controls' verb; the control's id.
Cancel = Callable[[str, str, str], Awaitable[int]]


class DelegationLoop:
    def __init__(self, ctx: BrainContext, interval: float, cancel: Cancel) -> None:
        self.ctx = ctx
        self.interval = interval
        self.cancel = cancel

    async def pass_once(self) -> int:
        """One look: accept the children to start, answer the calls whose child ended, cancel the
        children that should stop; how many records it moved."""
        store = self.ctx.store
        started = await store.transact(self._start)
        for call_id in started:
            self.ctx.killpoints.hit("brain.after_child_accepted", call_id)
        answered = await store.transact(self._answer)
        return len(started) + answered + await self._stop_children()

    async def _start(self, conn: Connection) -> list[str]:
        rows = await self.ctx.store.delegations.to_start(conn, BATCH)
        for e in rows:
            await self._start_one(conn, e)
        return [e["call_id"] for e in rows]

    async def _start_one(self, conn: Connection, e: Any) -> None:
        store = self.ctx.store
        self.ctx.killpoints.hit("brain.before_child_accepted", e["call_id"])  # nothing of it committed
        agent, _ = await self.ctx.threads.get(conn, e["thread_id"])
        delegate = agent.delegates.get(e["tool"])
        if delegate is None:  # its thread moved to an edited agent (a development server's)
            gone = {"agent_name": "", "agent_version": "", "budget": {}, "on_budget": "fail", "chain": []}
            await self._refuse(conn, e, gone, f"agent {agent.name} has no delegate {e['tool']!r} any more")
            return
        child = delegate.agent
        child_thread = thread_id(e["session_id"], rules.child_thread(delegate, e["id"]))
        parent = await store.delegations.of_child(conn, e["turn_id"])
        root = [_link(e["session_id"], e["thread_id"], agent.name)]
        chain = list(parent["chain"]) if parent is not None else root
        record = {
            "agent_name": child.name, "agent_version": child.version, "on_budget": delegate.on_budget,
            "budget": delegate.budget.model_dump(), "seconds": delegate.budget.seconds,
            "chain": [*chain, _link(e["session_id"], child_thread, child.name)],
            "child_thread_id": child_thread,
        }  # fmt: skip
        if e["status"] != "pending":  # the call ended first (its turn cancelled): no child, ever
            ended = f"the call was {e['status']} before its child was accepted"
            never = {
                **record,
                "status": Status.NEVER_STARTED,
                "reason": ended,
                "child_thread_id": None,
            }
            await store.delegations.record(conn, e, never)
            return
        why = rules.cycle(chain, child_thread, child.name)
        if why is None:
            try:
                await self._accept(conn, e, delegate, record)
                return
            except TendonError as exc:  # refused before anything was written (a thread of another agent)
                why = exc.message
        await self._refuse(conn, e, {**record, "child_thread_id": None}, why)

    async def _accept(
        self, conn: Connection, e: Any, delegate: rules.Delegate, record: dict[str, Any]
    ) -> None:
        """Accept the child turn, write its record and say so in the parent's stream: one commit."""
        store, child = self.ctx.store, delegate.agent
        name = rules.child_thread(delegate, e["id"])
        text = await _input(self.ctx, conn, e)
        submit = Submit(
            e["namespace"], shown_session(e["namespace"], e["session_id"]), rules.child_request(e["id"]),
            text, child, self.ctx.wake_channel, name,
        )  # fmt: skip
        turn_id = (await store.submits.submit_in(conn, submit, None)).turn_id
        await store.delegations.record(
            conn, e, {**record, "status": Status.RUNNING, "child_turn_id": turn_id}
        )
        said = {
            "child_turn": turn_id,
            "child_thread": name,
            "agent": {"name": child.name, "version": child.version},
        }
        await store.journal.append(
            conn, e["session_id"], e["turn_id"], [facts.delegated(e["id"], e["call_id"], e["tool"], said)],
            thread_id=e["thread_id"], status=e["turn_status"], phase=e["phase"],
        )  # fmt: skip
        log.info("child_accepted", execution_id=e["id"], child_turn=turn_id, thread=name)

    async def _refuse(self, conn: Connection, e: Any, record: dict[str, Any], why: str) -> None:
        store = self.ctx.store
        await store.delegations.record(conn, e, {**record, "status": Status.REFUSED, "reason": why})
        await store.controls.settle_by_hand(
            conn,
            e,
            status="failed",
            how="refused",
            result=None,
            error=Json({"code": "refused", "message": why}),
            evidence="refused by the delegation",
            wake_channel=self.ctx.wake_channel,
        )
        await store.journal.append(
            conn,
            e["session_id"],
            e["turn_id"],
            [facts.execution_event("failed", e["id"], e["call_id"], e["tool"], how="refused", reason=why)],
            thread_id=e["thread_id"],
            status=await store.turns.status_of(conn, e["turn_id"]),
            phase=e["phase"],
        )
        log.warning("delegation_refused", execution_id=e["id"], reason=why)

    async def _answer(self, conn: Connection) -> int:
        store = self.ctx.store
        rows = await store.delegations.ended(conn, BATCH)
        for turn_id, group in itertools.groupby(rows, key=lambda r: r["parent_turn_id"]):
            said: list[dict[str, Any]] = []
            for d in group:
                said += await self._answer_one(conn, d)
            await store.journal.append(
                conn, d["session_id"], turn_id, said, thread_id=d["parent_thread_id"],
                status=await store.turns.status_of(conn, turn_id), phase=d["parent_phase"],
            )  # fmt: skip
        return len(rows)

    async def _answer_one(self, conn: Connection, d: Any) -> list[dict[str, Any]]:
        """Settle the parent's call of a child that ended (unless the call ended first: a cancel of
        the parent); the facts that say so, and what the child spent."""
        store, child_turn, status = self.ctx.store, d["child_turn_id"], d["child_status"]
        child = await _facts(self.ctx, conn, d["session_id"], child_turn)
        said = []
        if d["call_status"] == "pending":
            outcome, how, result, error = rules.answer(
                status, d["child_result"], d["child_error"], on_budget=d["on_budget"],
                stopped=d["reason"] if d["status"] == Status.OVER_BUDGET else None,
                last_text=rules.last_text(child),
                executions=await store.executions.turn_executions(conn, child_turn),
            )  # fmt: skip
            call = {"id": d["execution_id"], "turn_id": d["parent_turn_id"], "tool_step": d["tool_step"]}
            await store.controls.settle_by_hand(
                conn, call, status=outcome, how=how, result=None if result is None else Json(result),
                error=Json(error) if error else None, evidence=f"child turn {child_turn} {status}",
                wake_channel=self.ctx.wake_channel,
            )  # fmt: skip
            said.append(facts.execution_event(outcome, d["execution_id"], d["call_id"], d["tool"], how=how))
        used = rules.used(child)
        said.append(
            facts.tool_delegated(d["execution_id"], d["call_id"], d["tool"], child_turn, status, used)
        )
        await store.delegations.settled(conn, d["execution_id"])
        return said

    async def _stop_children(self) -> int:
        """Cancel the children whose parent's call ended or whose time ran out (each a control,
        asked once by its request id), and say so in the parent's stream."""
        store = self.ctx.store
        rows = await store.read(lambda conn: store.delegations.to_cancel(conn, BATCH))
        for d in rows:
            over = d["call_status"] == "pending"  # else the parent's call ended: it was cancelled
            why = "its time budget is spent" if over else f"its parent's call was {d['call_status']}"
            control_id = await self.cancel(
                d["namespace"], d["child_turn_id"], rules.child_request(d["execution_id"])
            )

            async def work(
                conn: Connection, d: Any = d, why: str = why, over: bool = over, cid: int = control_id
            ) -> None:
                if not await store.delegations.cancel_asked(
                    conn, d["execution_id"], why, cid, over_budget=over
                ):
                    return  # another Brain's pass said it already
                fact = facts.child_cancel_requested(d["execution_id"], d["child_turn_id"], cid, why)
                await store.journal.append(
                    conn,
                    d["session_id"],
                    d["parent_turn_id"],
                    [fact],
                    thread_id=d["parent_thread_id"],
                    status=await store.turns.status_of(conn, d["parent_turn_id"]),
                )

            await store.transact(work)
            log.info(
                "child_cancel_requested",
                execution_id=d["execution_id"],
                child_turn=d["child_turn_id"],
                why=why,
            )
        return len(rows)

    async def run(self) -> None:
        await BackgroundLoop(
            "delegations", self.pass_once, period=self.interval, wake=self.ctx.delegations
        ).run()


def _link(session_key: str, thread: str, agent: str) -> dict[str, str]:
    return {
        "thread": thread,
        "thread_name": thread.removeprefix(session_key).removeprefix("/") or "main",
        "agent": agent,
    }


async def _facts(ctx: BrainContext, conn: Connection, session_key: str, turn_id: str) -> list[dict[str, Any]]:
    entries = await ctx.store.journal.entries(conn, session_key, turn_id=turn_id, limit=100_000)
    return [f for entry in entries for f in entry.facts]


async def _input(ctx: BrainContext, conn: Connection, e: Any) -> str:
    """The ``input`` the model gave the delegated call (from the reply that made it)."""
    for f in reversed(await _facts(ctx, conn, e["session_id"], e["turn_id"])):
        for call in (
            (f.get("message") or {}).get("tool_calls") or () if f.get("kind") == "turn.model_replied" else ()
        ):
            if call.get("call_id") == e["call_id"]:
                return str((call.get("args") or {}).get("input") or "")
    return ""


async def over_budget(ctx: BrainContext, row: TurnRow) -> TurnRow | None:
    """Before a child's model call: None while its budget lasts (and for any turn no delegation
    started: their request ids say so, no read). Once spent, the child fails (``on_budget: fail``:
    LimitReachedError) or completes with its last reply's text, ``partial: true``."""
    if not row.request_id.startswith(rules.REQUEST_PREFIX):
        return None

    async def read(conn: Connection) -> Any:
        d = await ctx.store.delegations.of_child(conn, row.id)
        now = await ctx.store.schedules.now(conn)
        if d is None:
            return None, [], [], now
        said = await _facts(ctx, conn, row.session_id, row.id)
        return d, said, await ctx.store.executions.turn_executions(conn, row.id), now

    d, said, executions, now = await ctx.store.read(read)
    if d is None:
        return None
    elapsed = (now - as_time(d["created_at"])).total_seconds() if isinstance(now, datetime) else 0.0
    why = rules.spent(rules.Budget.model_validate(d["budget"]), rules.used(said), elapsed)
    if why is None:
        return None
    if d["on_budget"] != "partial":
        raise LimitReachedError(f"the delegated turn stopped: {why}")
    result = rules.partial_result(rules.last_text(said), why, executions)
    move = moves.move(
        row,
        TurnStatus.COMPLETED,
        [TurnPhase.FINALIZE, TurnPhase.DONE],
        release=True,
        result=result,
        facts=(facts.completed(),),
    )
    moved = await ctx.move(move)
    ctx.history.committed(row, moved.row, moved.seq, move.facts)
    return moved.row
