"""The event relay: publishes what commits hand it to ``updates``, as batches of event ranges.

Events are part of their execution's row first (committed with the state change they describe)
and messages second. The committing code hands the relay the events it just committed; the
relay publishes them from memory, every execution's events that are ready together as one
contiguous range, many executions per message, and waits for the broker's confirm. Nothing is
read before publishing and nothing is marked after: a publish the broker refused is tried again
while this process lives; a crash between a commit and its publish is repaired from the ledger
when the Brain, hearing nothing, asks for a replay (or sends the command again), which any worker
of the route answers from the row (:meth:`EventRelay.replay`). The Brain drops what it has already
by seq.

Events that end nothing (accepted, started, an output page) may wait up to ``linger`` seconds for
company: a quick tool's outcome then takes them along, so its execution costs one message and
one apply on the Brain instead of two, and the outcome is not queued behind the first apply. An
ending event goes at once and takes everything pending with it. The wait delays only what a
watcher sees, never a turn: the turn waits for the outcome.

A command's delivery is acked here too, after the round that publishes the events pending when
its accept committed (:meth:`EventRelay.ack`): an ack is a frame to write and, in the broker, an
entry in the queue's log; sent while a quick tool ran, both fell on the way to its outcome's
statement (0.13 to 0.17 ms of a lone turn in ``bench.ab``). Any moment after the accept's commit
is a correct one for the ack (invariant 4), and this one is at most a linger later. A
worker whose every slot is taken acks at once: the broker sends it the next command only for an
ack (its prefetch is its concurrency), and a held one would leave the next command in the queue
until the round came (a pool of one slot would take each command a broker trip late).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from functools import partial
from typing import Any

from hands.store import Ledger
from infra.db import Connection
from infra.process.killpoints import KillPoints
from infra.process.logging import get_logger
from infra.transport import Delivery, Transport
from protocol import TERMINAL_EVENT_KINDS, OutputPageBody, batch_bytes, dumps, event_data, new_id

log = get_logger(__name__)

MAX_EVENTS = 256  # per message
# What a turn waits for: an outcome, or UNKNOWN (no worker will say more; a person reconciles it).
ENDING_KINDS = TERMINAL_EVENT_KINDS | {"unknown"}


def linger_left(ending: bool, waited: float, linger: float) -> float:
    """Seconds pending events may still wait for company: 0 when they go now (one of them
    ends its execution, or the oldest has waited ``linger``)."""
    return 0.0 if ending else max(0.0, linger - waited)


def ranges(events: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Events grouped by execution, each group split into contiguous ascending runs (duplicates
    dropped): the ranges a batch may carry."""
    by_execution: dict[str, dict[int, dict[str, Any]]] = {}
    for event in events:
        by_execution.setdefault(event["execution_id"], {}).setdefault(event["seq"], event)
    out: list[list[dict[str, Any]]] = []
    for seqs in by_execution.values():
        run: list[dict[str, Any]] = []
        for seq in sorted(seqs):
            if run and seq != run[-1]["seq"] + 1:
                out.append(run)
                run = []
            run.append(seqs[seq])
        out.append(run)
    return out


def messages(events: Iterable[dict[str, Any]], max_bytes: int) -> list[list[dict[str, Any]]]:
    """The events in messages of whole ranges, each message at most ``MAX_EVENTS`` events and
    about ``max_bytes`` (a range longer than that gets messages of its own, in order), and at
    most one range of an execution (a batch carries one per execution: events the output pages
    are missing between, as a takeover sends them, go as two)."""
    out: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    size = 0
    carried: set[str] = set()  # executions with a range in ``current``
    for run in ranges(events):
        if run[0]["execution_id"] in carried:
            out.append(current)
            current, size, carried = [], 0, set()
        carried.add(run[0]["execution_id"])
        for event in run:
            weight = len(dumps(event))
            if current and (len(current) >= MAX_EVENTS or size + weight > max_bytes):
                out.append(current)
                current, size, carried = [], 0, {event["execution_id"]}
            current.append(event)
            size += weight
    if current:
        out.append(current)
    return out


class EventRelay:
    """Publishes the events commits hand it; ``run()`` is its loop."""

    def __init__(
        self,
        ledger: Ledger,
        broker: Transport,
        *,
        route: str,
        interval: float,
        kill: KillPoints | None = None,
        max_bytes: int = 1024 * 1024,
        linger: float = 0.0,
    ) -> None:
        self._ledger = ledger
        self._broker = broker
        self._route = route
        self._interval = interval
        self._kill = kill or KillPoints()
        self._max_bytes = max_bytes
        self._linger = linger
        self._pending: list[dict[str, Any]] = []
        self._since = 0.0  # when the oldest pending event was handed over (monotonic)
        self._ending = False  # whether a pending event ends its execution
        self._refused = False  # the broker refused some of the last round: pause before the next
        # What the waiting round waits on (resolved by a hand-over that is due, or a timer): a
        # plain future, woken in one turn of the event loop (``wait_for`` on an event took three
        # and a task a round).
        self._wakeup: asyncio.Future[None] | None = None
        # The timer that ends a hand-over's linger: cancelled once what lingered went out (an
        # outcome took it along), or it woke the relay for nothing a linger later, in the middle
        # of whatever this worker did then.
        self._lingering: asyncio.TimerHandle | None = None
        self._acks: list[Delivery] = []  # command deliveries acked after the next round's publish
        self.messages = 0  # published, for tests and the benchmark
        self.events = 0
        self.rounds = 0  # times the relay woke

    def send(self, events: Iterable[dict[str, Any]]) -> None:
        """Publish these committed events (packed envelopes) soon."""
        first = not self._pending
        if first:
            self._since = time.monotonic()
        size = len(self._pending)
        self._pending.extend(events)
        ending = self._linger <= 0 or any(e["kind"] in ENDING_KINDS for e in self._pending[size:])
        self._ending = self._ending or ending
        if ending:
            self._wake()
        elif first:  # due when its linger ends: the waiting round is not woken to learn that now
            self._lingering = asyncio.get_running_loop().call_later(self._linger, self._wake)

    async def ack(self, delivery: Delivery, *, hold: bool = True) -> None:
        """Ack a command's delivery, whose accept committed: after the events pending now went
        out (with the outcome of a quick tool, else a linger later), at once when none are or
        when not ``hold``."""
        if hold and self._pending:
            self._acks.append(delivery)
        else:
            await _ack(delivery)

    async def ack_held(self) -> None:
        """Ack the deliveries held for a round now (a worker that stops consuming commands)."""
        acks, self._acks = self._acks, []
        for delivery in acks:
            await _ack(delivery)

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def _wait(self) -> float:
        """Seconds until the next round: what pending events may still linger, else the sweep's."""
        if not self._pending:
            return self._interval
        return min(self._interval, linger_left(self._ending, time.monotonic() - self._since, self._linger))

    async def publish_pending(self) -> int:
        """Publish what is pending; returns how many events were confirmed (what the broker
        refused stays pending for the next round)."""
        pending, self._pending = self._pending, []
        self._ending = False
        if self._lingering is not None:
            self._lingering.cancel()
            self._lingering = None
        if not pending:
            return 0
        batches = messages(pending, self._max_bytes)
        for kind in dict.fromkeys(e["kind"] for e in pending):
            self._kill.hit("hands.before_event_publish", kind)  # committed, not yet published
        queue = self._broker.topology.updates
        try:
            results = await self._broker.publish_many([(queue, batch_bytes(b), new_id()) for b in batches])
        except asyncio.CancelledError:
            self._pending = pending + self._pending  # stopped mid-publish: for the flush at exit
            raise
        except Exception as exc:  # noqa: BLE001 - kept for the next round
            results = [exc] * len(batches)
        await self.ack_held()  # published or not: their accepts committed
        confirmed = 0
        for batch, err in zip(batches, results, strict=True):
            if err is None:
                confirmed += len(batch)
                self.messages += 1
                continue
            log.warning("event_publish_failed", events=len(batch), error=f"{type(err).__name__}: {err}")
            self._pending.extend(batch)
            self._ending = self._refused = True  # no lingering: the next round tries them again
        self.events += confirmed
        return confirmed

    async def replay(self, execution_id: str, from_seq: int = 1) -> int:
        """Send an execution's events from ``from_seq`` on again, from its row (a replay request,
        a command that came again, a reconcile): no tool runs for it. Returns how many."""

        async def read(conn: Connection) -> list[dict[str, Any]]:
            return await stored_events(self._ledger, conn, execution_id, from_seq)

        events = await self._ledger.read(read)
        self.send(events)
        return len(events)

    async def sweep(self) -> None:
        """Publish the events of reconciliations that could not be published when they were made
        (by `hands reconcile`, or by a worker for a Brain's reconcile control)."""
        unsent = await self._ledger.read(lambda conn: self._ledger.unsent_reconciliations(conn, self._route))
        for audit_id, execution_id in unsent:
            await self.replay(execution_id)
            if await self.publish_pending() and not self._pending:
                await self._ledger.transact(partial(self._ledger.reconciliation_sent, audit_id=audit_id))

    async def flush(self) -> int:
        """Publish what recent commits produced now (at shutdown, after ``run`` stopped)."""
        return await self.publish_pending()

    async def run(self) -> None:
        """Publish on every hand-over (after its linger); every ``interval``, what could not be
        published before."""
        # Not a BackgroundLoop: a round's wait is the linger left of what is pending, cut short by
        # a hand-over that is due but never by one that may linger; the sweep is due on a clock of
        # its own; and a refused publish pauses the relay, which is no failure of the round.
        loop = asyncio.get_running_loop()
        next_sweep = 0.0
        while True:
            self._wakeup = loop.create_future()
            timer = loop.call_later(self._wait(), self._wake)  # due now, once lingered, or the sweep's
            try:
                await self._wakeup
            finally:
                timer.cancel()
            self.rounds += 1
            self._refused = False
            try:
                if self._pending and self._wait() == 0.0:
                    await self.publish_pending()
                if loop.time() >= next_sweep:
                    next_sweep = loop.time() + self._interval * 10
                    await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the rows are still there: the next round
                log.warning("event_relay_round_failed", error=repr(exc))
            if self._refused:
                # Not in a busy loop: what was refused is due again (no linger) after this pause.
                await asyncio.sleep(self._interval)


async def stored_events(
    ledger: Ledger, conn: Connection, execution_id: str, from_seq: int
) -> list[dict[str, Any]]:
    """An execution's events from ``from_seq`` on, as they were published: its status events from
    its row, its output pages rebuilt from ``output_chunks``."""
    row = await ledger.get(conn, execution_id)
    if row is None:
        return []
    events = [e for e in row.events if e["seq"] >= from_seq]
    for page in await ledger.pages(conn, execution_id, from_seq):
        body = OutputPageBody(offset=page["byte_offset"], data=page["data"])
        events.append(event_data(execution_id, row.header, page["seq"], body))
    return sorted(events, key=lambda e: e["seq"])


async def _ack(delivery: Delivery) -> None:
    """A failed ack only means a redelivery, which is a duplicate."""
    try:
        await delivery.ack()
    except Exception as exc:  # noqa: BLE001 - logged; the redelivery is handled as a duplicate
        log.warning("ack_failed", error=f"{type(exc).__name__}: {exc}")
