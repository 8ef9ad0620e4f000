"""Durable waits on the Brain's side (``brain.rules.waits``): the built-in calls whose clock came,
the one a signal answers, and what the clock does to them.

A wait is its PENDING execution's row: ``wait_until`` (indexed only while set) is when the clock
answers it, ``wait_key`` the signal it waits for. Nothing of it is in any process's memory, so it
survives every restart, and any Brain's scan answers it once (the row is locked, and its guarded
status write matches once).

A signal that came before any call waited for its key is a received control (``signal``): the
scan answers the call that waits for it once there is one, and rejects it once its turn ended.
"""

from __future__ import annotations

import itertools
from typing import Any

from brain.rules import facts
from brain.rules.states import ControlStatus
from brain.rules.waits import signalled, timed_out
from brain.store.part import Part
from brain.store.sql import TERMINAL_SQL, control_becomes
from infra.db import Connection, Json
from infra.db.store import as_time

_KEPT = "c.kind = 'signal' AND c.status = 'received'"  # signals kept for a call not waiting yet
_REJECTED = control_becomes(ControlStatus.REJECTED)


class Waits(Part):
    async def due(self, conn: Connection, limit: int = 500) -> list[Any]:
        """The waits whose clock came, locked (other Brains' scans skip them), by turn, with what
        their journal entry needs. (Every write that settles a wait clears its deadline.)"""
        return list(
            await conn.fetch(
                f"""SELECT e.id, e.turn_id, e.call_id, e.tool, e.tool_step, e.wait_key, e.created_at,
                           now() AS now, t.session_id, t.thread_id, t.phase
                      FROM executions e JOIN turns t ON t.id = e.turn_id
                     WHERE e.wait_until <= now() AND e.status = 'pending'
                     ORDER BY e.turn_id, e.call_id LIMIT $1{self.store.SKIP_LOCKED}""",
                limit,
            )
        )

    async def answer_due(self, conn: Connection, wake_channel: str, limit: int = 500) -> int:
        """Answer the waits whose clock came (a sleep's end, a signal's timeout), each turn's with
        one journal entry, waking the turns whose step that settled; how many it answered."""
        rows = await self.due(conn, limit)
        for turn_id, group in itertools.groupby(rows, key=lambda r: r["turn_id"]):
            said = []
            for e in group:
                waited = round((as_time(e["now"]) - as_time(e["created_at"])).total_seconds(), 3)
                how, result = timed_out(e["tool"], e["wait_key"], waited)
                await self.store.controls.settle_by_hand(
                    conn, e, status="succeeded", how=how, result=Json(result), error=None,
                    evidence="answered by the clock", wake_channel=wake_channel,
                )  # fmt: skip
                said.append(facts.execution_event("succeeded", e["id"], e["call_id"], e["tool"], how=how))
            await self.store.journal.append(
                conn, e["session_id"], turn_id, said, thread_id=e["thread_id"],
                status=await self.store.turns.status_of(conn, turn_id), phase=e["phase"],
            )  # fmt: skip
        return len(rows)

    async def answer_kept_signals(self, conn: Connection, wake_channel: str) -> int:
        """Answer the calls that wait for a signal that came before them (the oldest signal of the
        key first, one call each), each turn's with one journal entry; how many it answered. The
        signals are locked with their turns, as a signal's verb locks the turn before its call (and
        another Brain's scan skips them)."""
        kept = await conn.fetch(
            f"""SELECT c.id, c.turn_id, c.body, t.session_id, t.thread_id, t.phase
                  FROM controls c JOIN turns t ON t.id = c.turn_id
                 WHERE {_KEPT} ORDER BY c.turn_id, c.id{self.store.SKIP_LOCKED}"""
        )
        answered = 0
        for turn_id, group in itertools.groupby(kept, key=lambda r: r["turn_id"]):
            said: list[dict[str, Any]] = []
            for c in group:
                waiter = await self.waiting_for_signal(conn, turn_id, c["body"]["key"])
                if waiter is None:
                    continue
                await self.store.controls.decide_controls(conn, [c["id"]], "applied", None)
                said.append(facts.control(c["id"], "signal", "applied"))
                said.append(await self.signalled(conn, waiter, c["id"], c["body"], wake_channel))
                answered += 1
            if said:
                await self.store.journal.append(
                    conn, c["session_id"], turn_id, said, thread_id=c["thread_id"],
                    status=await self.store.turns.status_of(conn, turn_id), phase=c["phase"],
                )  # fmt: skip
        return answered

    async def reject_kept_signals(self, conn: Connection) -> int:
        """Reject the kept signals of turns that ended before a call waited for them (journaled)."""
        rows = await conn.fetch(
            f"""UPDATE controls SET {_REJECTED.set}, reason = $1, decided_at = now()
                 WHERE id IN (SELECT c.id FROM controls c JOIN turns t ON t.id = c.turn_id
                               WHERE {_KEPT} AND t.status IN {TERMINAL_SQL}{self.store.SKIP_LOCKED})
                   AND {_REJECTED.guard}
             RETURNING id, turn_id""",
            "its turn ended before a call waited for it",
        )
        for turn_id, group in itertools.groupby(sorted(rows, key=lambda r: (r["turn_id"], r["id"])),
                                                key=lambda r: r["turn_id"]):  # fmt: skip
            turn = await conn.fetchrow(
                "SELECT session_id, thread_id, status, phase FROM turns WHERE id = $1", turn_id
            )
            assert turn is not None  # the turn of its controls
            said = [facts.control(r["id"], "signal", "rejected", "its turn ended before a call waited for it")
                    for r in group]  # fmt: skip
            await self.store.journal.append(
                conn, turn["session_id"], turn_id, said, thread_id=turn["thread_id"], status=turn["status"],
                phase=turn["phase"],
            )  # fmt: skip
        return len(rows)

    async def signalled(
        self, conn: Connection, waiter: Any, control_id: int, body: Any, wake_channel: str
    ) -> dict[str, Any]:
        """Answer a call that waits for a signal with that signal (``body``: its key and payload),
        waking its turn if that settled its step; the fact that says so."""
        key = body["key"]
        result = Json(signalled(key, body.get("payload")))
        await self.store.controls.settle_by_hand(
            conn, waiter, status="succeeded", how="signalled", result=result, error=None,
            evidence=f"signal {key} (control #{control_id})", wake_channel=wake_channel,
        )  # fmt: skip
        return facts.execution_event(
            "succeeded", waiter["id"], waiter["call_id"], waiter["tool"], how="signalled"
        )

    async def waiting_for_signal(self, conn: Connection, turn_id: str, key: str) -> Any:
        """The turn's call that waits for signal ``key`` now (the oldest, if several do), locked, or
        None. The caller holds the turn's lock."""
        return await conn.fetchrow(
            f"""SELECT id, turn_id, call_id, tool, tool_step FROM executions
                WHERE turn_id = $1 AND status = 'pending' AND how = 'awaiting_signal' AND wait_key = $2
                ORDER BY created_at, call_id LIMIT 1{self.store.FOR_UPDATE}""",
            turn_id,
            key,
        )
