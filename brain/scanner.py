"""The periodic repair scan: wake-ups are hints, this makes sure none is lost for good.

It asks Hands to replay events when a gap persists (held events waiting for a missing seq)
and wakes waiting turns whose executions have all finished.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg

from brain.store import executions, outbox
from infra.broker import Topology
from infra.db import transact
from infra.logging import get_logger
from protocol import ReplayBody, ReplayControl, encode

log = get_logger(__name__)


class RepairScanner:
    def __init__(
        self,
        pool: asyncpg.Pool,
        topology: Topology,
        *,
        wake_channel: str,
        gap_timeout: float,
        interval: float,
        outbox_ready: Callable[[], None],
    ) -> None:
        self.pool = pool
        self.topology = topology
        self.wake_channel = wake_channel
        self.gap_timeout = gap_timeout
        self.interval = interval
        self.outbox_ready = outbox_ready

    async def scan_once(self) -> int:
        """One pass; returns how many replay requests it committed."""

        async def work(conn: asyncpg.Connection) -> int:
            gaps = await executions.gaps_to_replay(conn, self.gap_timeout)
            for g in gaps:
                control = ReplayControl(
                    execution_id=g["id"],
                    namespace=g["namespace"],
                    session_id=g["session_id"],
                    request_digest=g["request_digest"],
                    body=ReplayBody(from_seq=g["last_seq"] + 1),
                )
                await outbox.add(
                    conn, self.topology.controls(g["route"]), control.message_id, encode(control)
                )
                await conn.execute("UPDATE executions SET replay_requested_at = now() WHERE id = $1", g["id"])
                log.info("replay_requested", execution_id=g["id"], from_seq=g["last_seq"] + 1)
            await executions.wake_stuck_turns(conn, self.wake_channel)
            return len(gaps)

        requested = await transact(self.pool, work)
        if requested:
            self.outbox_ready()
        return requested

    async def run(self) -> None:
        while True:
            try:
                await self.scan_once()
            except (asyncpg.PostgresError, OSError) as exc:
                log.warning("repair_scan_error", error=repr(exc))
            await asyncio.sleep(self.interval)
