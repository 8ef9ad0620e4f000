"""The periodic recovery scan: takes over open executions nobody is working on.

Two kinds of row qualify:

- *orphans*: open rows whose owner is dead. Liveness is the owner's PostgreSQL advisory lock
  (``infra.liveness``): a killed process loses it the moment its socket closes, so a takeover
  waits one scan interval, not a lease. A claim is a compare-and-set on the owner column.
- *strays*: open rows this very worker owns but has no task for. A commit whose outcome was
  unclear (an accept or a claim that did land although the caller saw an error) or a release
  that failed leaves one; no other worker would ever claim it while this one lives.

Either way the replay rule then decides what to do (``Executor.recover``). Taking work over
uses concurrency slots like new commands do.

Each scan first checks that this worker still counts as alive. If its liveness session ended
while the process lives on, others are already claiming its rows: it abandons its local work
at once (``Executor.abandon``) and the process stops.
"""

from __future__ import annotations

import asyncio
from functools import partial

import asyncpg

from hands import ledger
from hands.executor import Executor
from infra.db import transact
from infra.logging import get_logger
from protocol import StaleOwnerError

log = get_logger(__name__)


class RecoveryScanner:
    """Every ``interval`` seconds, recover what dead workers of this route (or this worker's
    unclear commits) left open."""

    def __init__(
        self, *, pool: asyncpg.Pool, schema: str, route: str, executor: Executor, interval: float
    ) -> None:
        self._pool = pool
        self._schema = schema
        self._route = route
        self._executor = executor
        self._interval = interval

    async def scan_once(self) -> int:
        """One scan; returns how many executions this worker took over (strays included)."""
        ex = self._executor
        if ex.slots.locked():
            return 0
        async with self._pool.acquire() as conn:
            strays = await ledger.open_owned(
                conn, self._route, ex.worker_id, sorted(ex.reserved), ex.concurrency
            )
            orphans = await ledger.open_orphans(conn, self._schema, self._route, ex.worker_id, ex.concurrency)
        taken = 0
        for execution_id in strays:
            if ex.slots.locked():
                return taken
            await ex.slots.acquire()
            # Checked again after the wait: a handler may have reserved it meanwhile.
            if not ex.reserve(execution_id):
                ex.slots.release()
                continue
            ex.launch(execution_id, partial(ex.adopt, execution_id))
            taken += 1
        for execution_id, dead_owner in orphans:
            if ex.slots.locked():
                break
            await ex.slots.acquire()
            if not ex.reserve(execution_id):
                ex.slots.release()
                continue
            try:
                row = await transact(
                    self._pool,
                    partial(
                        ledger.claim_orphan,
                        schema=self._schema,
                        execution_id=execution_id,
                        dead_owner=dead_owner,
                        me=ex.worker_id,
                    ),
                )
            except BaseException:
                # If the claim did land after all, the row is now a stray: the next scan adopts it.
                ex.unreserve(execution_id)
                ex.slots.release()
                raise
            if row is None:  # another worker claimed it first, or the owner came back
                ex.unreserve(execution_id)
                ex.slots.release()
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

    async def check_alive(self) -> None:
        """Raise StaleOwnerError if other workers would now take this worker for dead.

        That happens when the liveness session ended while the process lives on (a database
        restart, a cut connection, a terminated backend). Others may be claiming its
        executions right now, so every local body is cancelled at once (no waiting for the
        shutdown grace) and nothing more is committed; then the process stops (and is
        restarted by whatever runs it).
        """
        async with self._pool.acquire() as conn:
            alive = await ledger.worker_alive(conn, self._schema, self._executor.worker_id)
        if not alive:
            reason = (
                f"worker {self._executor.worker_id} lost its liveness lock, so other workers "
                "treat it as dead and may take over its executions; stopping"
            )
            self._executor.abandon(reason)
            raise StaleOwnerError(reason)

    async def run(self) -> None:
        """Scan forever; ends (with StaleOwnerError) only if this worker lost its liveness."""
        while True:
            try:
                await self.check_alive()
                await self.scan_once()
            except StaleOwnerError:
                raise
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("recovery_scan_failed")
            await asyncio.sleep(self._interval)
