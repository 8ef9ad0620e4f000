"""The periodic repair scan: wake-ups are hints, this makes sure none is lost for good.

It asks Hands to replay events when a gap persists (held events waiting for a missing seq)
or when an execution made no progress for a while (its last event may be lost), publishes
a command again when Hands never acknowledged it (Hands dedups by execution id), and wakes
waiting turns whose executions have all finished.

Nothing is nudged while the answer may still be waiting in a line: no stall counts while the
Brains' updates queue has messages waiting (the event that shows progress may be among them),
and a command is not re-sent while its route's command queue has messages waiting (it may be
among them). Behind a backlog, "no progress yet" is the normal case, and every copy would make
the line longer and cost Hands a duplicate to turn away (measured: 2,000 waiting turns drew
3,364 copies before this rule). A lost message is repaired once the lines are gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg

from brain.store import executions, outbox
from infra.db import transact
from infra.logging import get_logger
from infra.transport import Topology
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
        stall_seconds: float,
        interval: float,
        outbox_ready: Callable[[], None],
        waiting: Callable[[str], Awaitable[int]],
    ) -> None:
        self.pool = pool
        self.topology = topology
        self.wake_channel = wake_channel
        self.gap_timeout = gap_timeout
        self.stall_seconds = stall_seconds
        self.interval = interval
        self.outbox_ready = outbox_ready
        self.waiting = waiting  # the transport's count of messages waiting in a queue
        # Routes whose command queue had messages waiting at the last look: a hint, rebuilt
        # by asking the broker again each pass.
        self.queued_routes: set[str] = set()

    async def scan_once(self) -> int:
        """One pass; returns how many messages it queued (replay requests, re-sent commands)."""
        lines = {r: await self._has_line(self.topology.commands(r)) for r in self.queued_routes}
        self.queued_routes = {r for r, line in lines.items() if line}
        updates_line = await self._has_line(self.topology.updates)

        async def work(conn: asyncpg.Connection) -> int:
            queued = 0
            for g in await executions.gaps_to_replay(conn, self.gap_timeout):
                await self._ask_replay(conn, g, reason="gap")
                queued += 1
            stalled = (
                []
                if updates_line
                else await executions.stalled(conn, self.stall_seconds, queued_routes=self.queued_routes)
            )
            for s in stalled:
                if s["status"] == "intended" and s["command_message_id"]:
                    route = s["route"]
                    if route not in lines:
                        lines[route] = await self._has_line(self.topology.commands(route))
                    if lines[route]:
                        self.queued_routes.add(route)
                        continue
                    # Hands never acknowledged the command and none waits in line: publish
                    # it again.
                    await outbox.republish(conn, s["command_message_id"])
                    await executions.mark_nudged(conn, s["id"])
                    log.info("command_resent", execution_id=s["id"])
                else:
                    await self._ask_replay(conn, s, reason="stalled")
                queued += 1
            await executions.wake_stuck_turns(conn, self.wake_channel)
            return queued

        queued = await transact(self.pool, work)
        if queued:
            self.outbox_ready()
        return queued

    async def _has_line(self, queue: str) -> bool:
        """Whether ``queue`` has messages waiting; False if the broker cannot say (then stalls
        are nudged as they would be without this rule)."""
        try:
            return await self.waiting(queue) > 0
        except Exception as exc:  # noqa: BLE001 - only a hint
            log.warning("queue_depth_unknown", queue=queue, error=repr(exc))
            return False

    async def _ask_replay(self, conn: asyncpg.Connection, e: asyncpg.Record, *, reason: str) -> None:
        control = ReplayControl(
            execution_id=e["id"],
            namespace=e["namespace"],
            session_id=e["session_id"],
            request_digest=e["request_digest"],
            body=ReplayBody(from_seq=e["last_seq"] + 1),
        )
        await outbox.add(conn, self.topology.controls(e["route"]), control.message_id, encode(control))
        if reason == "gap":
            await conn.execute("UPDATE executions SET replay_requested_at = now() WHERE id = $1", e["id"])
        else:
            await executions.mark_nudged(conn, e["id"])
        log.info("replay_requested", execution_id=e["id"], from_seq=e["last_seq"] + 1, reason=reason)

    async def run(self) -> None:
        while True:
            try:
                await self.scan_once()
            except Exception as exc:  # noqa: BLE001 - the scan must outlive any one bad pass
                log.warning("repair_scan_error", error=repr(exc))
            await asyncio.sleep(self.interval)
