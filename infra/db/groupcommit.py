"""Group commit: changes from concurrent callers share one transaction, and its statements.

Each change keeps its own meaning (one caller's change commits whole or not at all), but many
of them ride on one transaction, one fsync and a fixed number of statements: the batch is
handed whole to ``apply(conn, items)``, which writes all of them together (a multi-row statement
on PostgreSQL) and returns one result per item. Batches form on their own: while one
transaction commits, new changes queue up, and the next takes them all (up to ``limit``). A lone
change waits for nothing but the commit in flight.

A result may be an exception: that caller's change was refused without spoiling the others (the
batch function checked it before writing anything of it). If the whole transaction fails for a
reason that is not passing (bad data in one change, say), every change is tried again alone, so
one bad change fails only its own caller. A passing fault (a lost connection) fails the batch:
each caller handles it as it would on a transaction of its own.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

from infra.db import is_transient

T = TypeVar("T")
R = TypeVar("R")

ApplyBatch = Callable[[Any, list[T]], Awaitable[Sequence[R | BaseException]]]
Transact = Callable[..., Awaitable[Any]]  # a store's transact(work, single_statement=...)


class GroupCommit(Generic[T, R]):
    """Applies items with ``apply(conn, items)``, many per transaction, one transaction at a time.

    ``order`` sorts a batch before it is applied, so that concurrent batches (other processes)
    take row locks in the same order. ``alone(conn, item)`` may commit a lone item with one
    statement and no transaction around it (None: it goes the usual way). ``single(items)``:
    whether ``apply`` writes those items with one statement, which then commits on its own where
    the backend allows (no BEGIN and COMMIT round trips around it). ``orphaned(result)``: told the
    result of an item committed after its caller gave up (a cancelled caller), which may hold what
    must not be lost with it.
    """

    def __init__(
        self,
        transact: Transact,
        apply: ApplyBatch[T, R],
        *,
        name: str,
        order: Callable[[T], Hashable] | None = None,
        limit: int = 128,
        alone: Callable[[Any, T], Awaitable[R | None]] | None = None,
        single: Callable[[list[T]], bool] | None = None,
        orphaned: Callable[[R], None] | None = None,
    ) -> None:
        self.transact = transact
        self.apply = apply
        self.name = name
        self.alone = alone
        self.single = single
        self.orphaned = orphaned
        self.order = order
        self.limit = limit
        self._queue: list[tuple[T, asyncio.Future[R]]] = []
        self._runner: asyncio.Task[None] | None = None
        self.sizes: Counter[int] = Counter()  # committed transactions by how many items they carried

    @property
    def batches(self) -> int:
        return sum(self.sizes.values())

    @property
    def items(self) -> int:
        return sum(size * n for size, n in self.sizes.items())

    async def submit(self, item: T) -> R:
        """Apply ``item`` in the next shared transaction; returns once that committed (raises
        the item's refusal, or the batch's passing fault)."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._drain(), name=f"group-commit-{self.name}")
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
        items = [item for item, _ in batch]
        one = self.single is not None and self.single(items)
        try:
            results = await self.transact(lambda conn: self.apply(conn, items), single_statement=one)
        except Exception as exc:  # noqa: BLE001 - handed to the callers
            if len(batch) == 1 or is_transient(exc):
                for _, future in batch:
                    _settle(future, exc=exc)
                return
            await self._one_by_one(batch)
            return
        self.sizes[len(batch)] += 1
        for (_, future), result in zip(batch, results, strict=True):
            self._deliver(future, result)

    async def _alone(self, item: T, future: asyncio.Future[R]) -> bool:
        """Try ``alone`` on a lone item; True when that settled its caller."""
        alone = self.alone
        assert alone is not None
        try:
            result = await self.transact(lambda c: alone(c, item), single_statement=True)
        except Exception as exc:  # noqa: BLE001 - a passing fault goes to the caller
            if not is_transient(exc):
                return False  # the usual way meets it again and settles it
            _settle(future, exc=exc)
            return True
        if result is None:
            return False
        self.sizes[1] += 1
        self._deliver(future, result)
        return True

    async def _one_by_one(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        for item, future in batch:
            try:
                one = self.single is not None and self.single([item])
                (result,) = await self.transact(
                    lambda c, item=item: self.apply(c, [item]), single_statement=one
                )  # type: ignore[misc]
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                _settle(future, exc=exc)
            else:
                self.sizes[1] += 1
                self._deliver(future, result)

    def _deliver(self, future: asyncio.Future[R], result: R | BaseException) -> None:
        if future.cancelled() and self.orphaned is not None and not isinstance(result, BaseException):
            self.orphaned(result)
        _deliver(future, result)

    def stats(self) -> dict[str, Any]:
        """Transactions by batch size (for logs and the benchmark)."""
        return {
            "committer": self.name,
            "batches": self.batches,
            "items": self.items,
            "sizes": dict(self.sizes),
        }


def _deliver(future: asyncio.Future[R], result: R | BaseException) -> None:
    if isinstance(result, BaseException):
        _settle(future, exc=result)
    else:
        _settle(future, result=result)


def _settle(future: asyncio.Future[R], *, result: R | None = None, exc: BaseException | None = None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)  # type: ignore[arg-type]
