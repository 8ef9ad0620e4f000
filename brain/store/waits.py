"""Durable waits on the Brain's side (``brain.rules.waits``): the built-in calls whose clock came,
the one a signal answers, and what the clock does to them.

A wait is its PENDING execution's row: ``wait_until`` (indexed only while set) is when the clock
answers it, ``wait_key`` the signal it waits for. Nothing of it is in any process's memory, so it
survives every restart, and any Brain's scan answers it once (the row is locked, and its guarded
status write matches once).
"""

from __future__ import annotations

import itertools
from typing import Any

from brain.rules import facts
from brain.rules.waits import timed_out
from brain.store.part import Part
from infra.db import Connection, Json
from infra.db.store import as_time


class Waits(Part):
    async def due(self, conn: Connection, limit: int = 500) -> list[Any]:
        """The waits whose clock came, locked (other Brains' scans skip them), oldest first, with
        what their journal entry needs. A deadline left on a call settled otherwise (its turn was
        cancelled or failed) is cleared on the way."""
        await conn.execute(
            "UPDATE executions SET wait_until = NULL WHERE wait_until <= now() AND status <> 'pending'"
        )
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

    async def waiting_for_signal(self, conn: Connection, turn_id: str, key: str) -> Any:
        """The turn's call that waits for signal ``key`` now (the oldest, if several do), or None."""
        return await conn.fetchrow(
            """SELECT id, turn_id, call_id, tool, tool_step FROM executions
                WHERE turn_id = $1 AND status = 'pending' AND how = 'awaiting_signal' AND wait_key = $2
                ORDER BY created_at, call_id LIMIT 1""",
            turn_id,
            key,
        )
