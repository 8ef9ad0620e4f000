"""The periodic repair scan: wake-ups are hints, this makes sure none is lost for good.

It asks Hands to replay events when a gap persists (held events waiting for a missing seq)
or when an execution made no progress for a while (its last event may be lost), publishes
a command again when Hands never acknowledged it (Hands dedups by execution id), and wakes
waiting turns whose executions have all finished.

Every nudge is counted, and an answer resets the count: after ``repair_attempts`` nudges
without one (about half an hour with the defaults, as each waits twice as long as the one
before) the turn fails with an error that names the execution and its route, and its
executions are settled (invariant 15: nothing is asked forever). A command whose route has no
consumer at all is not re-sent, but the silence counts the same.

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

from brain.store import executions, outbox, repairs, turns
from infra.db import transact
from infra.logging import get_logger
from infra.transport import Topology
from protocol import NoAnswerError, ReplayBody, ReplayControl, encode

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
        consumers: Callable[[str], Awaitable[int]],
        repair_attempts: int = 8,
    ) -> None:
        self.pool = pool
        self.topology = topology
        self.wake_channel = wake_channel
        self.gap_timeout = gap_timeout
        self.stall_seconds = stall_seconds
        self.interval = interval
        self.outbox_ready = outbox_ready
        self.waiting = waiting  # the transport's count of messages waiting in a queue
        self.consumers = consumers  # ... and of its consumers
        self.repair_attempts = repair_attempts
        # Routes whose command queue had messages waiting for a consumer that exists, at the
        # last look: a hint, rebuilt by asking the broker again each pass.
        self.queued_routes: set[str] = set()

    async def scan_once(self) -> int:
        """One pass; returns how many messages it queued (replay requests, re-sent commands,
        cancels of the executions of turns it gave up on)."""
        lines = {r: await self._line(r) for r in self.queued_routes}
        self.queued_routes = {r for r, (line, served) in lines.items() if line and served}
        updates_line = await self._has_line(self.topology.updates)

        async def work(conn: asyncpg.Connection) -> int:
            queued = 0
            for g in await repairs.gaps_to_replay(conn, self.gap_timeout):
                if g["nudges"] >= self.repair_attempts:
                    queued += await self._give_up(conn, g, f"event #{g['last_seq'] + 1} never came")
                    continue
                await self._ask_replay(conn, g, from_seq=g["last_seq"] + 1, reason="gap")
                queued += 1
            stalled = (
                []
                if updates_line
                else await repairs.stalled(conn, self.stall_seconds, queued_routes=self.queued_routes)
            )
            for s in stalled:
                if s["nudges"] >= self.repair_attempts:
                    queued += await self._give_up(
                        conn, s, f"nothing was heard of it since it was {s['status']}"
                    )
                    continue
                if s["status"] == "intended" and s["command_message_id"]:
                    queued += await self._resend(conn, s, lines)
                else:
                    # From the last applied event on: Hands that have the execution answer with
                    # at least that one again, which shows they are there (see executions.receive).
                    await self._ask_replay(conn, s, from_seq=max(1, s["last_seq"]), reason="stalled")
                    queued += 1
            await executions.wake_stuck_turns(conn, self.wake_channel)
            await turns.wake_due(conn, self.wake_channel)
            return queued

        queued = await transact(self.pool, work)
        if queued:
            self.outbox_ready()
        return queued

    async def _resend(
        self, conn: asyncpg.Connection, s: asyncpg.Record, lines: dict[str, tuple[bool, bool]]
    ) -> int:
        """A command Hands never acknowledged: publish it again, unless it is most likely in a
        line that moves (then nothing, and nothing counted) or nobody serves its route (then
        nothing is sent, but the silence counts towards giving up)."""
        route = s["route"]
        if route not in lines:
            lines[route] = await self._line(route)
        line, served = lines[route]
        if not served:
            await repairs.mark_nudged(conn, s["id"])
            log.warning("route_not_served", execution_id=s["id"], route=route, nudges=s["nudges"] + 1)
            return 0
        if line:
            self.queued_routes.add(route)
            return 0
        await outbox.republish(conn, s["command_message_id"])
        await repairs.mark_nudged(conn, s["id"])
        log.info("command_resent", execution_id=s["id"], nudges=s["nudges"] + 1)
        return 1

    async def _give_up(self, conn: asyncpg.Connection, e: asyncpg.Record, what: str) -> int:
        """Fail the turn of an execution whose Hands stayed silent through every nudge: a
        visible error, instead of asking forever. Returns the cancels queued."""
        error = NoAnswerError(
            f"no answer from the Hands of route {e['route']} about execution {e['id']} after "
            f"{e['nudges']} attempts: {what}"
        )
        log.error("repair_given_up", execution_id=e["id"], turn_id=e["turn_id"], reason=error.message)
        return await repairs.fail_turn(conn, e["turn_id"], error.as_dict(), self.wake_channel, self.topology)

    async def _line(self, route: str) -> tuple[bool, bool]:
        """Whether ``route``'s command queue has messages waiting, and whether anyone serves it.
        Unknown (the broker cannot say): no line, served, as without these rules."""
        queue = self.topology.commands(route)
        try:
            return await self.waiting(queue) > 0, await self.consumers(queue) > 0
        except Exception as exc:  # noqa: BLE001 - only a hint
            log.warning("queue_depth_unknown", queue=queue, error=repr(exc))
            return False, True

    async def _has_line(self, queue: str) -> bool:
        """Whether ``queue`` has messages waiting; False if the broker cannot say (then stalls
        are nudged as they would be without this rule)."""
        try:
            return await self.waiting(queue) > 0
        except Exception as exc:  # noqa: BLE001 - only a hint
            log.warning("queue_depth_unknown", queue=queue, error=repr(exc))
            return False

    async def _ask_replay(
        self, conn: asyncpg.Connection, e: asyncpg.Record, *, from_seq: int, reason: str
    ) -> None:
        control = ReplayControl(
            execution_id=e["id"],
            namespace=e["namespace"],
            session_id=e["session_id"],
            request_digest=e["request_digest"],
            body=ReplayBody(from_seq=from_seq),
        )
        await outbox.add(conn, self.topology.controls(e["route"]), control.message_id, encode(control))
        await repairs.mark_nudged(conn, e["id"])
        log.info(
            "replay_requested", execution_id=e["id"], from_seq=from_seq, reason=reason, nudges=e["nudges"] + 1
        )

    async def run(self) -> None:
        while True:
            try:
                await self.scan_once()
            except Exception as exc:  # noqa: BLE001 - the scan must outlive any one bad pass
                log.warning("repair_scan_error", error=repr(exc))
            await asyncio.sleep(self.interval)
