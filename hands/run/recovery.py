"""The periodic recovery scan: takes over open executions nobody is working on, and passes on
the cancels that reached another worker.

Two kinds of row qualify:

- *orphans*: open rows whose owner is dead: handed to a released name when the owner was
  presumed dead (``infra.liveness``: a lease that ran out, or a lock gone for longer than the
  grace) or when it gave them up. A claim is a compare-and-set on the owner column.
- *strays*: open rows this very worker owns but has no task for. A commit whose outcome was
  unclear (an accept or a claim that did land although the caller saw an error) or a release
  that failed leaves one; no other worker would ever claim it while this one lives.

Either way the replay rule then decides what to do (``Executor.recover``). Taking work over
uses concurrency slots like new commands do. That this worker itself is still alive is the
liveness keeper's business (``hands.app``), not the scan's.

The same read of this worker's open rows carries their ``cancel_requested`` flag. A cancel comes
on the route's control queue, which every worker of the pool consumes; the one that receives it
sets the flag in the ledger and signals the execution only if it runs there. So each scan signals
``ctx.cancelled`` of the executions running here whose flag is set: a cancel reaches its running
tool within one scan interval whatever the pool's size. A worker that dies first leaves the
execution to the replay rule, and its start is guarded by the flag.
"""

from __future__ import annotations

from functools import partial

from hands.run.executor import Executor
from hands.run.tasks import Tasks
from hands.store import Ledger
from infra.db import Connection
from infra.process.logging import get_logger
from infra.process.loops import BackgroundLoop

log = get_logger(__name__)


class RecoveryScanner:
    """Every ``interval`` seconds, recover what dead workers of this route (or this worker's
    unclear commits) left open: found in the ``ledger``, reserved and given a slot among this
    worker's ``tasks``, run by the ``executor``."""

    def __init__(
        self, *, route: str, ledger: Ledger, tasks: Tasks, executor: Executor, interval: float
    ) -> None:
        self._ledger = ledger
        self._route = route
        self._tasks = tasks
        self._executor = executor
        self._loop = BackgroundLoop("recovery-scan", self.scan_once, period=interval)

    def wake(self) -> None:
        """Scan now: a worker was just presumed dead, its executions are orphans."""
        self._loop.wake()

    async def scan_once(self) -> int:
        """One scan; returns how many executions this worker took over (strays included)."""
        tasks = self._tasks
        busy = tasks.slots.locked()  # nothing can be taken over, but cancels still pass on
        if busy and not tasks.in_flight:
            return 0
        ledger, me, route = self._ledger, tasks.worker_id, self._route

        async def look(conn: Connection) -> tuple[list[tuple[str, bool]], list[tuple[str, str]]]:
            owned = await ledger.open_owned(conn, route, me)
            return owned, [] if busy else await ledger.open_orphans(conn, route, me, tasks.concurrency)

        owned, orphans = await ledger.read(look)
        self._pass_on_cancels(owned)
        if busy:
            return 0
        reserved = tasks.reserved
        strays = [execution_id for execution_id, _ in owned if execution_id not in reserved]
        return await self._adopt(strays[: tasks.concurrency]) + await self._claim(orphans)

    async def _adopt(self, strays: list[str]) -> int:
        tasks, ex = self._tasks, self._executor
        taken = 0
        for execution_id in strays:
            if tasks.slots.locked():
                break
            await tasks.slots.acquire()
            # Checked again after the wait: a handler may have reserved it meanwhile.
            if not tasks.reserve(execution_id):
                tasks.slots.release()
                continue
            ex.launch(execution_id, partial(ex.adopt, execution_id))
            taken += 1
        return taken

    async def _claim(self, orphans: list[tuple[str, str]]) -> int:
        tasks, ex, ledger, me = self._tasks, self._executor, self._ledger, self._tasks.worker_id
        taken = 0
        for execution_id, dead_owner in orphans:
            if tasks.slots.locked():
                break
            await tasks.slots.acquire()
            if not tasks.reserve(execution_id):
                tasks.slots.release()
                continue
            try:
                row = await ledger.transact(
                    partial(ledger.claim_orphan, execution_id=execution_id, dead_owner=dead_owner, me=me)
                )
            except BaseException:
                # If the claim did land after all, the row is now a stray: the next scan adopts it.
                tasks.unreserve(execution_id)
                tasks.slots.release()
                raise
            if row is None:  # another worker claimed it first, or the owner came back
                tasks.unreserve(execution_id)
                tasks.slots.release()
                continue
            status = row.status.value
            log.info("execution_claimed", execution_id=execution_id, dead_owner=dead_owner, status=status)
            ex.launch(execution_id, partial(ex.recover, row))
            taken += 1
        return taken

    def _pass_on_cancels(self, owned: list[tuple[str, bool]]) -> None:
        """Signal ``ctx.cancelled`` of the executions running here whose cancel another worker
        of the pool received: the route's control queue is shared, so a cancel lands on the
        worker that runs its execution only by chance; the flag it set in the ledger does not."""
        for execution_id, asked in owned:
            if asked and execution_id in self._tasks.reserved and not self._tasks.cancel_asked(execution_id):
                self._tasks.cancel_local(execution_id)
                log.info("cancel_passed_on", execution_id=execution_id, how="seen in the ledger")

    async def run(self) -> None:
        """Scan forever; a failed scan (the database away) is logged and tried again."""
        await self._loop.run()
