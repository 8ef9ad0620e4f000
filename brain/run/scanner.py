"""The periodic repair scan: wake-ups are hints, this makes sure none is lost for good.

It looks at the turns that wait for their tools once their time to be looked at came (``wake_at``
of a waiting turn: a little after its intents were committed, then whenever one of its executions
may be due for a nudge). For each execution of the turn's step that is not final:

- a command whose Brain died before its publish was confirmed is sent again at once (it is
  still in the execution's row; the Hands take a duplicate for what it is);
- an execution that made no progress for ``stall_seconds`` is nudged: its command sent again if
  the Hands never acknowledged it, else a replay of its events asked for.

It also asks for a replay when events wait behind a gap for longer than ``gap_timeout``, and
wakes waiting turns whose executions have all finished (a lost hint) or whose deadline came, and
answers the built-in waits whose clock came (a sleep's end, a signal's timeout) or whose signal
came before them (``brain.store.waits``).

Every nudge is counted, and an answer resets the count: after ``repair_attempts`` nudges without
one (about half an hour with the defaults, as each waits twice as long as the one before) the
turn fails with an error that names the execution and its route, and its executions are settled
(invariant 15: nothing is asked forever). A command or a replay request whose route has no
consumer at all is not sent (it would pile up in the queue for a pool that comes later), but the
silence counts the same.

Nothing is nudged while the answer may still be waiting in a line: no stall counts while the
Brains' updates queue has messages waiting, and a command is not sent again while its route's
command queue has messages waiting (it may be among them; measured: 2,000 waiting turns drew
3,364 copies before this rule). A lost message is repaired once the lines are gone.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from brain.rules.submits import shown_session
from brain.run.batches import admit_open
from brain.run.context import BrainContext
from brain.store import Settled
from infra.db import Connection
from infra.process.logging import get_logger
from infra.process.loops import BackgroundLoop
from protocol import NoAnswerError, ReplayBody, ReplayControl, encode

log = get_logger(__name__)

# A turn whose open executions all wait for something else (a reconcile): looked at again only
# this much later, unless an event wakes it first.
FAR = 24 * 3600.0


class Nudge(StrEnum):
    NONE = "none"
    RESEND = "resend"  # publish the command again
    REPLAY = "replay"  # ask the Hands to send the events again
    GIVE_UP = "give_up"  # fail the turn: the Hands never answered


def nudge_for(e: Mapping[str, Any], *, stall: float, attempts: int, updates_line: bool) -> Nudge:
    """What an open execution of a waiting turn needs now (a pure rule). The command of a turn
    being cancelled is never sent again: its cancel (in the outbox until confirmed) settles it, and
    the Hands are asked about it instead, answering from the tombstone the cancel left."""
    now: datetime = e["now"]
    resend = e["status"] == "intended" and not e.get("cancelling")
    if resend and not e["creator_alive"] and e["nudges"] == 0:
        return Nudge.RESEND  # its Brain is gone: its publish may never have happened
    quiet = now - e["updated_at"] >= timedelta(seconds=stall)
    backoff = e["replay_requested_at"] is None or (
        now - e["replay_requested_at"] >= timedelta(seconds=stall * e["stall_backoff"])
    )
    if not (quiet and backoff) or updates_line:
        return Nudge.NONE
    if e["nudges"] >= attempts:
        return Nudge.GIVE_UP
    return Nudge.RESEND if resend else Nudge.REPLAY


def next_look(e: Mapping[str, Any], *, stall: float, nudged: bool) -> float:
    """Seconds until an open execution may need a nudge (after this pass nudged it or not)."""
    now: datetime = e["now"]
    if nudged:
        return stall * min(64, e["stall_backoff"] * 2)
    due = e["updated_at"] + timedelta(seconds=stall)
    if e["replay_requested_at"] is not None:
        due = max(due, e["replay_requested_at"] + timedelta(seconds=stall * e["stall_backoff"]))
    return max(0.05, (due - now).total_seconds())


@dataclass
class Pass:
    """What one pass queued: messages to publish once it committed, turns it failed."""

    messages: list[tuple[str, bytes, str]] = field(default_factory=list)
    settled: list[Settled] = field(default_factory=list)


class RepairScanner:
    def __init__(
        self,
        ctx: BrainContext,
        *,
        gap_timeout: float,
        stall_seconds: float,
        interval: float,
        waiting: Callable[[str], Awaitable[int]],
        consumers: Callable[[str], Awaitable[int]],
        publish: Callable[[list[tuple[str, bytes, str]]], Awaitable[Any]],
        repair_attempts: int = 8,
    ) -> None:
        self.ctx = ctx
        self.gap_timeout = gap_timeout
        self.stall_seconds = stall_seconds
        self.interval = interval
        self.waiting = waiting  # the transport's count of messages waiting in a queue
        self.consumers = consumers  # ... and of its consumers
        self.publish = publish
        self.repair_attempts = repair_attempts
        # Routes whose command queue had messages waiting for a consumer that exists, at the
        # last look: a hint, rebuilt by asking the broker again each pass.
        self.queued_routes: set[str] = set()

    async def scan_once(self) -> int:
        """One pass; returns how many messages it sent (replay requests, commands sent again,
        cancels of the executions of turns it gave up on)."""
        store = self.ctx.store
        lines = {r: await self._line(r) for r in self.queued_routes}
        self.queued_routes = {r for r, (line, served) in lines.items() if line and served}
        updates_line = await self._has_line(self.ctx.topology.updates)

        async def work(conn: Connection) -> Pass:
            done = Pass()
            for g in await store.repairs.gaps_to_replay(conn, self.gap_timeout):
                if g["nudges"] >= self.repair_attempts:
                    await self._give_up(conn, g, f"event #{g['last_seq'] + 1} never came", done)
                else:
                    await self._ask_replay(conn, g, g["last_seq"] + 1, "gap", done, lines)
            # Turns with nothing left to wait for first: the look below pushes the others on.
            await store.repairs.wake_stuck(conn, self.ctx.wake_channel)
            await store.repairs.wake_due(conn, self.ctx.wake_channel)
            await store.waits.answer_kept_signals(conn, self.ctx.wake_channel)
            await store.waits.answer_due(conn, self.ctx.wake_channel)
            await store.waits.reject_kept_signals(conn)
            done.messages += await admit_open(self.ctx, conn)  # batches a lost apply left behind
            due = await store.repairs.due_waiting(conn)
            looks: dict[str, float] = {}
            for turn_id, group in itertools.groupby(due, key=lambda r: r["turn_id"]):
                later = await self._look_at(
                    conn, [e for e in group if e["id"] is not None], lines, updates_line, done
                )
                if later is not None:
                    looks[turn_id] = later
            if looks:
                await store.repairs.look_later(conn, looks)
            return done

        done = await store.transact(work)
        if done.messages:
            await self.publish(done.messages)
        for settled in done.settled:
            self.ctx.failed(settled)
        return len(done.messages) + sum(len(s.controls) for s in done.settled)

    async def _look_at(
        self, conn: Connection, open_executions: list[Any], lines: dict[str, tuple[bool, bool]],
        updates_line: bool, done: Pass,
    ) -> float | None:  # fmt: skip
        """Nudge what a waiting turn waits for; the seconds until its next look (None: it failed)."""
        later = FAR
        for e in open_executions:
            action = nudge_for(
                e, stall=self.stall_seconds, attempts=self.repair_attempts, updates_line=updates_line
            )
            if action is Nudge.GIVE_UP:
                await self._give_up(conn, e, f"nothing was heard of it since it was {e['status']}", done)
                return None
            nudged = False
            if action is Nudge.RESEND:
                nudged = await self._resend(conn, e, lines, done)
            elif action is Nudge.REPLAY:
                # From the last applied event on: Hands that have the execution answer with at
                # least that one again, which shows they are there (see the store's apply).
                await self._ask_replay(conn, e, max(1, e["last_seq"]), "stalled", done, lines)
                nudged = True
            later = min(later, next_look(e, stall=self.stall_seconds, nudged=nudged))
        return later

    async def _resend(
        self, conn: Connection, e: Any, lines: dict[str, tuple[bool, bool]], done: Pass
    ) -> bool:
        """A command Hands never acknowledged: publish it again, unless it is most likely in a
        line that moves (then nothing, and nothing counted) or nobody serves its route (then
        nothing is sent, but the silence counts towards giving up)."""
        route = e["route"]
        line, served = await self._route(route, lines)
        if not served:
            await self._unserved(conn, e)
            return True
        if line and e["creator_alive"]:
            self.queued_routes.add(route)
            return False
        done.messages.append(
            (self.ctx.topology.commands(route), bytes(e["command"]), e["command_message_id"])
        )
        await self.ctx.store.repairs.mark_nudged(conn, e["id"])
        log.info("command_resent", execution_id=e["id"], nudges=e["nudges"] + 1)
        return True

    async def _give_up(self, conn: Connection, e: Any, what: str, done: Pass) -> None:
        """Fail the turn of an execution whose Hands stayed silent through every nudge: a visible
        error, instead of asking forever."""
        error = NoAnswerError(
            f"no answer from the Hands of route {e['route']} about execution {e['id']} after "
            f"{e['nudges']} attempts: {what}"
        )
        log.error("repair_given_up", execution_id=e["id"], turn_id=e["turn_id"], reason=error.message)
        settled = await self.ctx.store.failures.fail_turn(
            conn, e["turn_id"], error.as_dict(), self.ctx.topology, wake_channel=self.ctx.wake_channel
        )
        if settled is not None:
            done.settled.append(settled)

    async def _route(self, route: str, lines: dict[str, tuple[bool, bool]]) -> tuple[bool, bool]:
        """``_line`` of ``route``, asked once per pass."""
        if route not in lines:
            lines[route] = await self._line(route)
        return lines[route]

    async def _unserved(self, conn: Connection, e: Any) -> None:
        """Nobody serves the route: nothing is sent (it would only pile up in the queue, to be
        read by a pool that comes later), but the silence counts towards giving up."""
        await self.ctx.store.repairs.mark_nudged(conn, e["id"])
        log.warning("route_not_served", execution_id=e["id"], route=e["route"], nudges=e["nudges"] + 1)

    async def _ask_replay(
        self, conn: Connection, e: Any, from_seq: int, reason: str, done: Pass,
        lines: dict[str, tuple[bool, bool]],
    ) -> None:  # fmt: skip
        if not (await self._route(e["route"], lines))[1]:
            await self._unserved(conn, e)
            return
        control = ReplayControl(
            execution_id=e["id"],
            namespace=e["namespace"],
            session_id=shown_session(e["namespace"], e["session_id"]),
            request_digest=e["request_digest"],
            body=ReplayBody(from_seq=from_seq),
        )
        done.messages.append((self.ctx.topology.controls(e["route"]), encode(control), control.message_id))
        await self.ctx.store.repairs.mark_nudged(conn, e["id"])
        log.info(
            "replay_requested", execution_id=e["id"], from_seq=from_seq, reason=reason, nudges=e["nudges"] + 1
        )

    async def _line(self, route: str) -> tuple[bool, bool]:
        """Whether ``route``'s command queue has messages waiting, and whether anyone serves it.
        Unknown (the broker cannot say): no line, served, as without these rules."""
        queue = self.ctx.topology.commands(route)
        try:
            return await self.waiting(queue) > 0, await self.consumers(queue) > 0
        except Exception as exc:  # noqa: BLE001 - only a hint
            log.warning("queue_depth_unknown", queue=queue, error=repr(exc))
            return False, True

    async def _has_line(self, queue: str) -> bool:
        """Whether ``queue`` has messages waiting; False if the broker cannot say."""
        try:
            return await self.waiting(queue) > 0
        except Exception as exc:  # noqa: BLE001 - only a hint
            log.warning("queue_depth_unknown", queue=queue, error=repr(exc))
            return False

    async def run(self) -> None:
        """A pass every ``interval`` seconds, forever: the scan must outlive any one bad pass."""
        await BackgroundLoop("repair-scan", self.scan_once, period=self.interval).run()
