"""The schedule loop: every Brain looks for schedules whose time came, every scan interval, and
fires each in one commit (invariant 19): the row locked (another Brain skips it), its turn accepted
under a request id made of the schedule and the time it fires for, and the row moved on to its next
time. A Brain that dies before the commit fired nothing; one that dies after it fired once, and the
next look finds the row moved on. A time missed while no Brain ran is fired once, late, and the
turn's accepted fact says so (``brain.rules.schedules``)."""

from __future__ import annotations

from typing import Any

from brain.rules import schedules as rules
from brain.rules.agents import AgentDefinition
from brain.rules.submits import Submit
from brain.run.context import BrainContext
from infra.db import Connection
from infra.db.store import as_time
from infra.process.logging import get_logger
from infra.process.loops import BackgroundLoop
from protocol import TendonError

log = get_logger(__name__)

BATCH = 100  # schedules fired per commit at most; the rest in the next pass


class ScheduleLoop:
    def __init__(self, ctx: BrainContext, interval: float) -> None:
        self.ctx = ctx
        self.interval = interval

    async def fire_due(self) -> int:
        """One look: fire the schedules due now; how many fired."""
        store = self.ctx.store

        async def work(conn: Connection) -> int:
            rows = await store.schedules.due(conn, BATCH)
            for row in rows:
                await self._fire(conn, row)
            return len(rows)

        return await store.transact(work)

    async def _fire(self, conn: Connection, r: Any) -> None:
        due, now = as_time(r["next_at"]), as_time(r["now"])
        fire = rules.firing(r["id"], r["cron"], due, now, tolerance=self.interval + 1.0)
        submit = Submit(
            r["namespace"], r["session_id"], fire.request_id, r["input"],
            AgentDefinition.model_validate(r["agent"]), self.ctx.wake_channel, r["thread"],
            schedule=fire.said,
        )  # fmt: skip
        turn_id, error = None, None
        try:
            # Queued for any Brain's claim; refused before anything was written, or accepted.
            turn_id = (await self.ctx.store.submits.submit_in(conn, submit, None)).turn_id
        except TendonError as exc:  # a closed thread, another agent's thread: said on the schedule
            error = exc.message
        await self.ctx.store.schedules.fired(conn, r["id"], due, fire.next_at, turn_id, error)
        log.info("schedule_fired", schedule_id=r["id"], due_at=due.isoformat(), turn_id=turn_id, error=error,
                 **{k: v for k, v in fire.said.items() if k in ("late_seconds", "missed")})  # fmt: skip

    async def run(self) -> None:
        await BackgroundLoop("schedules", self.fire_due, period=self.interval).run()
