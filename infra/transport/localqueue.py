"""The embedded mode's transport: durable queues in one SQLite file, no server.

``LocalBroker`` keeps the contract of ``infra.transport.broker.Broker`` on RabbitMQ quorum queues (see
``infra.transport``): FIFO per queue, at-least-once, ``publish`` returns after the commit,
``prefetch`` bounds unsettled deliveries, a message handed out more than ``delivery_limit``
times is dead-lettered to ``Topology.dlq(queue)``, and unsettled deliveries come back when
their consumer closes or their process dies.

The rows are the truth; which rows are out for delivery is known in memory only, so a process
that dies leaves them deliverable to the next one that opens the file. Hence only one process
may consume a file at a time; others may publish into it (a CLI verb): consumers poll every
``poll_interval`` for that, and in-process publishes wake them at once. All SQLite work runs
on one dedicated thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from infra.process.logging import get_logger
from infra.transport import REASON_HEADER, Delivery, DeliveryHandler

if TYPE_CHECKING:
    from infra.transport import Topology

__all__ = ["LocalBroker", "LocalConsumer", "LocalDelivery"]

log = get_logger(__name__)
T = TypeVar("T")
_Row = tuple[int, str | None, str, bytes, int]  # id, message_id, headers (JSON), body, deliveries

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- AUTOINCREMENT: ids never reused, id order is FIFO
    queue TEXT NOT NULL,
    message_id TEXT,
    headers TEXT NOT NULL,
    body BLOB NOT NULL,
    deliveries INTEGER NOT NULL DEFAULT 0  -- times handed out, counted before the handler runs
);
CREATE INDEX IF NOT EXISTS messages_by_queue ON messages (queue, id);
"""
_INSERT = "INSERT INTO messages (queue, message_id, headers, body) VALUES (?, ?, ?, ?)"


def _death(queue: str, reason: str) -> dict[str, str]:
    """The headers RabbitMQ puts on a message it dead-letters (without its x-death list)."""
    return {"x-first-death-queue": queue, "x-first-death-reason": reason}


class LocalDelivery:
    """One message handed to a handler; satisfies ``infra.transport.Delivery``."""

    def __init__(self, consumer: LocalConsumer, row: _Row) -> None:
        self._consumer = consumer
        self.row_id, self.message_id, headers, self.body, earlier = row
        self.headers: dict[str, Any] = json.loads(headers)
        if earlier:  # what RabbitMQ quorum queues tell a redelivery
            self.headers["x-delivery-count"] = earlier
        self._processed = False
        self.returned = False  # its consumer closed first: the queue owns the message again

    @property
    def processed(self) -> bool:
        return self._processed

    async def ack(self) -> None:
        await self._settle("ack")

    async def nack(self, *, requeue: bool = True) -> None:
        await self.reject(requeue=requeue)  # the same thing on a quorum queue

    async def reject(self, *, requeue: bool = False) -> None:
        if requeue:
            await self._settle("requeue")
        else:
            await self._settle("park", _death(self._consumer.queue, "rejected"))

    async def _settle(self, action: str, extra: dict[str, Any] | None = None) -> None:
        if self.returned:
            raise RuntimeError(f"delivery {self.message_id!r} was returned to the queue: its consumer closed")
        if self._processed:
            raise RuntimeError(f"delivery {self.message_id!r} is already settled")
        self._processed = True
        broker = self._consumer.broker
        try:
            await broker._call(broker._settle_sync, self._consumer.queue, [self.row_id], action, extra)
        except BaseException:
            self._processed = False  # still ours: the caller may try again or let close return it
            raise
        self._consumer._settled(self)


class LocalConsumer:
    """A subscription to one queue; satisfies ``infra.transport.Consumer``."""

    def __init__(self, broker: LocalBroker, queue: str, handler: DeliveryHandler, prefetch: int) -> None:
        if prefetch < 1:
            raise ValueError("prefetch must be at least 1")
        self.broker, self.queue, self._handler, self._prefetch = broker, queue, handler, prefetch
        self._unsettled: set[LocalDelivery] = set()
        self._wake = asyncio.Event()
        self._stopping = False
        self._closed = False
        self._task = asyncio.create_task(self._fetch(), name=f"localqueue-consume:{queue}")

    @property
    def is_closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Stop fetching and hand every unsettled delivery back to the queue.

        Running handlers are not cancelled, but settling their deliveries now raises.
        """
        await self._stop()
        if self._closed:
            return
        self._closed = True
        returned = [d for d in self._unsettled if not d.processed]
        for delivery in returned:
            delivery.returned = True
        self._unsettled.clear()
        with contextlib.suppress(ValueError):
            self.broker._consumers.remove(self)
        await self.broker._call(self.broker._settle_sync, self.queue, [d.row_id for d in returned], "requeue")
        self.broker._wake(self.queue)

    async def _stop(self) -> None:
        self._stopping = True
        self._wake.set()
        await asyncio.gather(self._task, return_exceptions=True)

    def _settled(self, delivery: LocalDelivery) -> None:
        self._unsettled.discard(delivery)
        self.broker._wake(self.queue)

    async def _fetch(self) -> None:
        broker = self.broker
        # Not a BackgroundLoop: a consumer's fetch, which fetches again at once while there is
        # more than its prefetch took, and hands back what it claimed while closing.
        while not self._stopping:
            self._wake.clear()  # before the query: a publish after it sets the event again
            free = self._prefetch - len(self._unsettled)
            rows: list[_Row] = []
            if free > 0:
                try:
                    rows = await broker._call(broker._claim_sync, self.queue, free)
                except Exception:
                    log.exception("localqueue_fetch_failed", queue=self.queue)
            if self._stopping and rows:  # claimed while closing: give them straight back
                await broker._call(broker._settle_sync, self.queue, [r[0] for r in rows], "requeue")
                break
            for row in rows:
                delivery = LocalDelivery(self, row)
                self._unsettled.add(delivery)
                task = asyncio.create_task(self._run(delivery), name=f"localqueue-handle:{self.queue}")
                broker._tasks.add(task)
                task.add_done_callback(broker._tasks.discard)
            if len(rows) < free or free <= 0:  # nothing more now: sleep until woken or next poll
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), broker.poll_interval)

    async def _run(self, delivery: LocalDelivery) -> None:
        try:
            await self._handler(delivery)
        except Exception:
            log.exception("localqueue_handler_failed", queue=self.queue, message_id=delivery.message_id)
            if not delivery.processed and not delivery.returned:
                with contextlib.suppress(Exception):
                    await delivery.nack(requeue=True)


class LocalBroker:
    """Durable queues in the SQLite file ``path``; use as ``async with LocalBroker(...)``."""

    def __init__(
        self,
        path: Path,
        topology: Topology,
        *,
        delivery_limit: int = 5,
        poll_interval: float = 0.2,
        close_timeout: float = 2.0,
    ) -> None:
        self.path = Path(path)
        self.topology = topology
        self.delivery_limit = delivery_limit
        self.poll_interval = poll_interval
        self.close_timeout = close_timeout  # how long closing lets running handlers finish
        self._db: sqlite3.Connection | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._leased: set[int] = set()  # rows out for delivery; touched only on the db thread
        self._consumers: list[LocalConsumer] = []
        self._present: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def connected(self) -> bool:
        """A file in this process: there is no connection to lose while it is open."""
        return self._db is not None

    async def __aenter__(self) -> LocalBroker:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="localqueue")
        await self._call(self._open_sync)
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Stop consuming, give running handlers ``close_timeout`` s to settle, return the rest."""
        consumers = list(self._consumers)
        await asyncio.gather(*(c._stop() for c in consumers))
        if self._tasks:  # let running handlers finish (and settle) for a moment
            _, late = await asyncio.wait(set(self._tasks), timeout=self.close_timeout)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        for consumer in consumers:
            await consumer.close()
        if self._thread is not None:
            if self._db is not None:
                await self._call(self._db.close)
            self._thread.shutdown(wait=True)
            self._db, self._thread = None, None

    async def declare(self, queue: str) -> None:
        """Nothing to do: a queue exists as soon as a row names it."""

    async def publish(
        self, queue: str, body: bytes, *, message_id: str, headers: dict[str, Any] | None = None
    ) -> None:
        """Return once the message is committed (fsynced): the local publisher confirm."""
        await self._call(self._insert_sync, [(queue, message_id, json.dumps(headers or {}), body)])
        self._wake(queue)

    async def publish_many(self, items: list[tuple[str, bytes, str]]) -> list[BaseException | None]:
        """Commit all items in one transaction, so they are confirmed (or fail) together."""
        try:
            await self._call(self._insert_sync, [(q, mid, "{}", body) for q, body, mid in items])
        except Exception as exc:
            return [exc for _ in items]
        for queue in {q for q, _, _ in items}:
            self._wake(queue)
        return [None for _ in items]

    async def dead_letter(self, queue: str, message: Delivery, reason: str) -> None:
        """Move ``message`` to ``queue``'s dead-letter queue with a reason, in one transaction
        (a delivery of another kind, such as one command of a batch, is parked as a copy, then
        acked, as RabbitMQ's broker does it)."""
        if not isinstance(message, LocalDelivery):
            headers = {**(message.headers or {}), REASON_HEADER: reason[:1000]}
            dlq = self.topology.dlq(queue)
            await self.publish(dlq, message.body, message_id=message.message_id or "", headers=headers)
            await message.ack()
        else:
            await message._settle("park", {REASON_HEADER: reason[:1000]})  # atomic: no copy left behind
        log.warning("dead_lettered", queue=queue, message_id=message.message_id, reason=reason)

    async def park(self, queue: str, body: bytes, *, message_id: str, reason: str) -> None:
        """Put ``body`` in ``queue``'s dead-letter queue with a reason."""
        await self.publish(
            self.topology.dlq(queue), body, message_id=message_id, headers={REASON_HEADER: reason[:1000]}
        )
        log.warning("parked", queue=queue, message_id=message_id, reason=reason)

    async def waiting(self, queue: str) -> int:
        """Messages in ``queue`` not out for delivery in this process."""
        return await self._call(self._waiting_sync, queue)

    async def announce_presence(self, queue: str) -> None:
        """Held while this broker is open; only this process uses the file (see the notes)."""
        self._present.add(queue)

    async def present(self, queue: str) -> bool:
        return queue in self._present

    async def consumers(self, queue: str) -> int:
        """Consumers of ``queue``: only this process consumes the file (see the module notes)."""
        return sum(1 for c in self._consumers if c.queue == queue and not c.is_closed)

    async def consume(self, queue: str, handler: DeliveryHandler, *, prefetch: int) -> LocalConsumer:
        """Start delivering ``queue`` to ``handler``, one task per delivery, ``prefetch`` at most."""
        if self._db is None:
            raise RuntimeError("LocalBroker used outside `async with`")
        consumer = LocalConsumer(self, queue, handler, prefetch)
        self._consumers.append(consumer)
        return consumer

    # ---- plumbing; the *_sync methods run on the db thread only ---------------------------

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._thread is None:
            raise RuntimeError("LocalBroker used outside `async with`")
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _wake(self, queue: str) -> None:
        for consumer in self._consumers:
            if consumer.queue == queue:
                consumer._wake.set()

    def _open_sync(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None)  # explicit BEGIN/COMMIT below
        db.execute("PRAGMA busy_timeout = 5000")  # another process may be publishing
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = FULL")  # a commit is a confirm: it must survive power loss
        db.executescript(_SCHEMA)
        self._db = db

    def _tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        assert self._db is not None
        self._db.execute("BEGIN IMMEDIATE")
        try:
            result = fn(self._db)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        return result

    def _insert_sync(self, rows: list[tuple[str, str | None, str, bytes]]) -> None:
        self._tx(lambda db: db.executemany(_INSERT, rows))

    def _claim_sync(self, queue: str, limit: int) -> list[_Row]:
        def claim(db: sqlite3.Connection) -> list[_Row]:
            rows: list[_Row] = db.execute(
                "SELECT id, message_id, headers, body, deliveries FROM messages WHERE queue = ?"
                " AND id NOT IN (SELECT value FROM json_each(?)) ORDER BY id LIMIT ?",
                (queue, json.dumps(sorted(self._leased)), limit),
            ).fetchall()
            out = []
            for row in rows:
                if row[4] > self.delivery_limit:  # handed out too often by closed or dead consumers
                    self._park(db, queue, row[0], _death(queue, "delivery_limit"))
                    continue
                db.execute("UPDATE messages SET deliveries = deliveries + 1 WHERE id = ?", (row[0],))
                out.append(row)
            return out

        claimed = self._tx(claim)
        self._leased.update(row[0] for row in claimed)
        return claimed

    def _waiting_sync(self, queue: str) -> int:
        assert self._db is not None
        row = self._db.execute(
            "SELECT count(*) FROM messages WHERE queue = ? AND id NOT IN (SELECT value FROM json_each(?))",
            (queue, json.dumps(sorted(self._leased))),
        ).fetchone()
        return int(row[0])

    def _settle_sync(
        self, queue: str, row_ids: list[int], action: str, extra: dict[str, Any] | None = None
    ) -> None:
        def settle(db: sqlite3.Connection) -> None:
            for row_id in row_ids:
                if action == "ack":
                    db.execute("DELETE FROM messages WHERE id = ?", (row_id,))
                elif action == "park":
                    self._park(db, queue, row_id, extra or {})
                else:  # requeue; each delivery was counted when handed out: past the limit, park
                    row = db.execute("SELECT deliveries FROM messages WHERE id = ?", (row_id,)).fetchone()
                    if row is not None and row[0] > self.delivery_limit:
                        self._park(db, queue, row_id, _death(queue, "delivery_limit"))

        if row_ids:
            self._tx(settle)
        self._leased.difference_update(row_ids)

    def _park(self, db: sqlite3.Connection, queue: str, row_id: int, extra: dict[str, Any]) -> None:
        # A new row (new id) so the dead-letter queue is FIFO in the order messages died.
        row = db.execute("SELECT message_id, headers, body FROM messages WHERE id = ?", (row_id,)).fetchone()
        if row is None:
            return
        headers = json.dumps({**json.loads(row[1]), **extra})
        db.execute(_INSERT, (self.topology.dlq(queue), row[0], headers, row[2]))
        db.execute("DELETE FROM messages WHERE id = ?", (row_id,))
