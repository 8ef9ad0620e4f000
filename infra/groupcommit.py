"""Group commit: changes from concurrent callers share one transaction.

Each change keeps its own meaning (one caller's state change commits whole or not at all),
but under load many of them ride on one fsync instead of paying one each. Batches form on
their own: while one transaction commits, new changes queue up, and the next transaction
takes them all (up to ``limit``). A lone change waits for nothing but the commit in flight.

If a shared transaction fails for a reason that is not passing (bad data in one change, say),
every change of the batch is tried again alone, so one bad change fails only its own caller.
A passing fault (lost connection, deadlock after ``transact``'s retries) fails the whole batch:
each caller handles it as it would handle that fault on its own transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

import asyncpg

from infra.db import is_transient, transact

T = TypeVar("T")
R = TypeVar("R")

Apply = Callable[[asyncpg.Connection, T], Awaitable[R]]


class GroupCommit(Generic[T, R]):
    """Applies items with ``apply(conn, item)``, many per transaction, one transaction at a time.

    ``order`` sorts a batch before it is applied, so that concurrent batches (other processes)
    take row locks in the same order.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        apply: Apply[T, R],
        *,
        order: Callable[[T], Hashable] | None = None,
        limit: int = 128,
        alone: Apply[T, R | None] | None = None,
    ) -> None:
        self.pool = pool
        self.apply = apply
        # A lone item may commit with no transaction around it: ``alone`` applies it in one
        # statement or returns None (then it goes the usual way, in a transaction).
        self.alone = alone
        self.order = order
        self.limit = limit
        self._queue: list[tuple[T, asyncio.Future[R]]] = []
        self._runner: asyncio.Task[None] | None = None
        self.batches = 0  # committed transactions, for tests and benchmarks
        self.items = 0

    async def submit(self, item: T) -> R:
        """Apply ``item`` in the next shared transaction; returns once that committed."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._drain(), name="group-commit")
        return await future

    async def _drain(self) -> None:
        batch: list[tuple[T, asyncio.Future[R]]] = []
        try:
            while self._queue:
                batch, self._queue = self._queue[: self.limit], self._queue[self.limit :]
                batch = [(item, f) for item, f in batch if not f.done()]  # callers that gave up
                if batch:
                    await self._commit(batch)
                batch = []
        except asyncio.CancelledError:
            # Shutting down: nobody will commit these; their callers must not wait forever.
            for _, future in batch + self._queue:
                future.cancel()
            self._queue = []
            raise

    async def _commit(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        if len(batch) == 1 and self.alone is not None and await self._alone(*batch[0]):
            return
        if self.order is not None:
            key = self.order
            batch.sort(key=lambda pair: key(pair[0]))  # type: ignore[arg-type, return-value]

        async def together(conn: asyncpg.Connection) -> list[R]:
            return [await self.apply(conn, item) for item, _ in batch]

        try:
            results = await transact(self.pool, together)
        except Exception as exc:  # noqa: BLE001 - handed to the callers
            if len(batch) == 1 or is_transient(exc):
                for _, future in batch:
                    _settle(future, exc=exc)
                return
            await self._one_by_one(batch)
            return
        self.batches += 1
        self.items += len(batch)
        for (_, future), result in zip(batch, results, strict=True):
            _settle(future, result=result)

    async def _alone(self, item: T, future: asyncio.Future[R]) -> bool:
        """Try ``alone`` on a lone item; True when that settled its caller."""
        alone = self.alone
        assert alone is not None
        try:
            result = await transact(self.pool, lambda c: alone(c, item), single_statement=True)
        except Exception as exc:  # noqa: BLE001 - a passing fault goes to the caller
            if not is_transient(exc):
                return False  # the usual way meets it again and settles it
            _settle(future, exc=exc)
            return True
        if result is None:
            return False
        self.batches += 1
        self.items += 1
        _settle(future, result=result)
        return True

    async def _one_by_one(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        for item, future in batch:
            try:
                result = await transact(self.pool, lambda c, item=item: self.apply(c, item))  # type: ignore[misc]
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                _settle(future, exc=exc)
            else:
                self.batches += 1
                self.items += 1
                _settle(future, result=result)


def _settle(future: asyncio.Future[R], *, result: R | None = None, exc: BaseException | None = None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)  # type: ignore[arg-type]
