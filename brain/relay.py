"""The Brain's outbox relay: publishes committed outbox rows to RabbitMQ with confirms.

A row is marked published only after the broker confirmed it, so a crash or a lost
connection means "publish again", which Hands dedups by execution id.
"""

from __future__ import annotations

import asyncio

import asyncpg

from brain.store import outbox
from infra.db import transact
from infra.logging import get_logger
from infra.transport import Transport

log = get_logger(__name__)


class OutboxRelay:
    def __init__(self, pool: asyncpg.Pool, broker: Transport, *, interval: float, batch: int = 200) -> None:
        self.pool = pool
        self.broker = broker
        self.interval = interval
        self.batch = batch
        self._wake = asyncio.Event()

    def notify(self) -> None:
        """A hint that rows were committed; the periodic scan covers lost hints."""
        self._wake.set()

    async def publish_pending(self) -> int:
        """Publish one batch of unpublished rows; returns how many were confirmed."""
        async with self.pool.acquire() as conn:
            rows = await outbox.unpublished(conn, self.batch)
        if not rows:
            return 0
        results = await self.broker.publish_many(
            [(r["queue"], bytes(r["payload"]), r["message_id"]) for r in rows]
        )
        confirmed = [r["id"] for r, err in zip(rows, results, strict=True) if err is None]
        for r, err in zip(rows, results, strict=True):
            if err is not None:
                log.warning("outbox_publish_failed", queue=r["queue"], error=repr(err))
        if confirmed:
            await transact(self.pool, lambda c: outbox.mark_published(c, confirmed), single_statement=True)
        return len(confirmed) if len(confirmed) == len(rows) else -1

    async def run(self) -> None:
        while True:
            self._wake.clear()
            try:
                published = await self.publish_pending()
            except Exception as exc:  # noqa: BLE001 - the rows are still there: the next round
                log.warning("outbox_relay_error", error=repr(exc))
                published = -1
            if published > 0:
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.interval)
            except TimeoutError:
                pass
