"""The event outbox relay: publishes committed events to ``updates`` until confirmed.

Events are rows first (committed with the state change they describe) and messages second.
The relay is woken with the execution ids a commit just touched and publishes those at
once; a periodic scan publishes anything else still unconfirmed (a lost wake-up, a broker
outage, events a dead worker left behind). No transaction is held while publishing, and an
event is marked published only after the broker confirmed it, so the worst case is a
duplicate, which the Brain drops by seq.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterable

import asyncpg

from hands import ledger
from infra.db import is_transient, transact
from infra.killpoints import KillPoints
from infra.logging import get_logger
from infra.transport import Transport

log = get_logger(__name__)


class EventRelay:
    """Publishes the pool's unpublished events; ``run()`` is its loop, ``wake()`` its hint."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        broker: Transport,
        *,
        route: str | None,
        interval: float,
        kill: KillPoints | None = None,
        batch: int = 500,
    ) -> None:
        self._pool = pool
        self._broker = broker
        self._route = route
        self._interval = interval
        # An event due for longer than this is nobody's "hot" event any more: the periodic scan
        # takes it. Waiting a little avoids racing the owner that is publishing it right now.
        self._stale_after = 2 * interval
        self._kill = kill or KillPoints()
        self._batch = batch
        self._hot: set[str] = set()
        self._wakeup = asyncio.Event()

    def wake(self, execution_id: str) -> None:
        """Hint that ``execution_id`` has new committed events (call after the commit)."""
        self._hot.add(execution_id)
        self._wakeup.set()

    async def publish_pending(
        self, *, execution_ids: Iterable[str] | None = None, older_than: float | None = None
    ) -> int:
        """Publish unpublished events (of these executions, or due for ``older_than`` s).

        Returns how many were confirmed. Loops over batches until nothing is left or a batch
        could not be fully confirmed (the next scan tries again).
        """
        ids = list(execution_ids) if execution_ids is not None else None
        confirmed_total = 0
        while True:
            async with self._pool.acquire() as conn:
                events = await ledger.pending_events(
                    conn,
                    route=self._route,
                    execution_ids=ids,
                    older_than=older_than,
                    limit=self._batch,
                )
            if not events:
                return confirmed_total
            for event in events:
                self._kill.hit("hands.before_event_publish", event.execution_id)
            results = await self._broker.publish_many(
                [(self._broker.topology.updates, e.payload, e.message_id) for e in events]
            )
            confirmed = [e for e, err in zip(events, results, strict=True) if err is None]
            for event, err in zip(events, results, strict=True):
                if err is not None:
                    log.warning(
                        "event_publish_failed",
                        execution_id=event.execution_id,
                        seq=event.seq,
                        error=f"{type(err).__name__}: {err}",
                    )
            if confirmed:  # one statement for the whole batch, not one per event
                mark = functools.partial(ledger.mark_published, events=confirmed)
                await transact(self._pool, mark, single_statement=True)
            confirmed_total += len(confirmed)
            if len(confirmed) < len(events) or len(events) < self._batch:
                return confirmed_total

    async def flush(self) -> int:
        """Publish what recent commits produced now (at shutdown, after ``run`` stopped)."""
        hot, self._hot = self._hot, set()
        return await self.publish_pending(execution_ids=hot) if hot else 0

    async def run(self) -> None:
        """Publish on every wake-up, and scan for stale events every ``interval`` seconds."""
        next_scan = 0.0
        while True:
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout=self._interval)
            except TimeoutError:
                pass
            self._wakeup.clear()
            hot, self._hot = self._hot, set()
            try:
                if hot:
                    await self.publish_pending(execution_ids=hot)
                if time.monotonic() >= next_scan:
                    next_scan = time.monotonic() + self._interval
                    await self.publish_pending(older_than=self._stale_after)
            except asyncio.CancelledError:
                self._hot |= hot  # for flush() at shutdown
                raise
            except Exception as exc:
                # The rows are still there: the next round repairs whatever this one missed.
                self._hot |= hot
                if is_transient(exc):
                    log.warning("event_relay_round_failed", error=repr(exc))
                else:
                    log.exception("event_relay_round_failed")
                await asyncio.sleep(self._interval)
