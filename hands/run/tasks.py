"""The bookkeeping of a worker's executions: concurrency slots, reservations, one task each,
their cancel signals, and what happens when the worker must stop.

An execution must never stay open under this live worker with nobody working on it: no other
worker would ever claim it (they only claim rows of dead owners). So a task that fails for good
closes its row (FAILED or UNKNOWN) or releases it to the replay rule (``Outcomes.settled``, which
``Executor.launch`` wraps every task's work in), and the recovery scan adopts any open row of
this worker that has no task here (see ``hands.run.recovery``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from infra.db import is_transient
from infra.process.logging import get_logger
from protocol import StaleOwnerError, is_retryable

log = get_logger(__name__)


def passing(exc: BaseException) -> bool:
    """Whether the same step may work when tried again later: a service fault (connection,
    restart, object store), as opposed to data the database refuses or a bug."""
    return is_transient(exc) or is_retryable(exc)


class Tasks:
    """Runs this worker's executions as tasks, at most ``concurrency`` at once.

    A caller takes a slot (``await slots.acquire()``) and reserves the execution id
    (:meth:`reserve`) before it commits to new work, then hands both over with
    ``Executor.launch``; the task gives them back when it ends.
    """

    def __init__(self, worker_id: str, concurrency: int) -> None:
        self.worker_id = worker_id
        self.concurrency = concurrency
        self.slots = asyncio.Semaphore(concurrency)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        # Execution ids this process works on: from reserve() until their task ends.
        self._reserved: set[str] = set()
        self._cancelled: dict[str, asyncio.Event] = {}
        self._abandoned: str | None = None  # why this worker stopped committing, once it did

    @property
    def abandoned(self) -> str | None:
        """Why this worker stopped committing (:meth:`abandon`), or None while it commits."""
        return self._abandoned

    def fence(self) -> None:
        if self._abandoned is not None:
            raise StaleOwnerError(f"worker {self.worker_id} commits nothing more: {self._abandoned}")

    def reserve(self, execution_id: str) -> bool:
        """Take ``execution_id`` for this process before committing to work on it.

        False if something here already has it (a task, or another handler of the same
        command), or if this worker was abandoned. The recovery scan adopts open rows of this
        worker that nobody here reserved, so reserving *before* the commit is what keeps a
        command handler and the scan from running the same execution twice. From now on a cancel
        for it reaches its ``ctx.cancelled`` (a body not started yet then never starts).
        """
        if self._abandoned is not None or execution_id in self._reserved:
            return False
        self._reserved.add(execution_id)
        self._cancelled.setdefault(execution_id, asyncio.Event())
        return True

    def unreserve(self, execution_id: str) -> None:
        """Give back a reservation that did not lead to :meth:`launch`."""
        if execution_id not in self._tasks:
            self._reserved.discard(execution_id)
            self._cancelled.pop(execution_id, None)

    @property
    def reserved(self) -> frozenset[str]:
        return frozenset(self._reserved)

    def launch(self, execution_id: str, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work`` as this (reserved) execution's task; the caller's slot and reservation
        are released when it ends."""
        assert execution_id in self._reserved and execution_id not in self._tasks, execution_id
        self._cancelled.setdefault(execution_id, asyncio.Event())
        task = asyncio.create_task(self._run(execution_id, work), name=f"execution-{execution_id}")
        self._tasks[execution_id] = task

    async def _run(self, execution_id: str, work: Callable[[], Awaitable[None]]) -> None:
        try:
            await work()
        finally:
            self._tasks.pop(execution_id, None)
            self._reserved.discard(execution_id)
            self._cancelled.pop(execution_id, None)
            self.slots.release()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def cancel_local(self, execution_id: str) -> bool:
        """Signal a local execution's ``ctx.cancelled``; False if it is not here."""
        event = self._cancelled.get(execution_id)
        if event is None:
            return False
        event.set()
        return True

    def cancel_signal(self, execution_id: str) -> asyncio.Event:
        """The ``ctx.cancelled`` of a (reserved) execution, made if it has none yet."""
        return self._cancelled.setdefault(execution_id, asyncio.Event())

    def cancel_asked(self, execution_id: str) -> bool:
        event = self._cancelled.get(execution_id)
        return event is not None and event.is_set()

    def abandon(self, reason: str) -> None:
        """Stop all local work now: this worker no longer counts as alive.

        Other workers may be claiming its executions already, so a body left running (even for
        the shutdown grace) would be a second copy of the same execution. Every local body is
        told (``ctx.cancelled``) and its task cancelled, and no commit, so no event, leaves this
        worker any more; the rows stay as they are, for the replay rule of whichever worker
        claims them.
        """
        if self._abandoned is not None:
            return
        self._abandoned = reason
        log.error("worker_abandoned", reason=reason, executions=len(self._tasks))
        for event in self._cancelled.values():
            event.set()
        for task in self._tasks.values():
            task.cancel()

    async def drain(self, grace: float) -> None:
        """Let running executions finish for up to ``grace`` seconds, then cancel the rest."""
        tasks = list(self._tasks.values())
        if not tasks:
            return
        log.info("draining", executions=len(tasks), grace=grace)
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
