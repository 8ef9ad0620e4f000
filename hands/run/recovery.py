"""The periodic recovery scan: takes over open executions nobody is working on.

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
        tasks, ex = self._tasks, self._executor
        if tasks.slots.locked():
            return 0
        ledger, me = self._ledger, tasks.worker_id

        async def look(conn: Connection) -> tuple[list[str], list[tuple[str, str]]]:
            strays = await ledger.open_owned(conn, self._route, me, sorted(tasks.reserved), tasks.concurrency)
            return strays, await ledger.open_orphans(conn, self._route, me, tasks.concurrency)

        strays, orphans = await ledger.read(look)
        taken = 0
        for execution_id in strays:
            if tasks.slots.locked():
                return taken
            await tasks.slots.acquire()
            # Checked again after the wait: a handler may have reserved it meanwhile.
            if not tasks.reserve(execution_id):
                tasks.slots.release()
                continue
            ex.launch(execution_id, partial(ex.adopt, execution_id))
            taken += 1
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
            log.info(
                "execution_claimed",
                execution_id=execution_id,
                dead_owner=dead_owner,
                status=row.status.value,
            )
            ex.launch(execution_id, partial(ex.recover, row))
            taken += 1
        return taken

    async def run(self) -> None:
        """Scan forever; a failed scan (the database away) is logged and tried again."""
        await self._loop.run()
