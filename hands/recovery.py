"""The periodic dead-owner scan: takes over open executions whose worker died.

Liveness is the owner's PostgreSQL advisory lock (``infra.liveness``): a killed process
loses it the moment its socket closes, so a takeover waits one scan interval, not a lease.
A claim is a compare-and-set on the owner column; the replay rule then decides what to do
(``Executor.recover``). Claims take concurrency slots like new commands do.
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
    """Every ``interval`` seconds, claim and recover what dead workers of this route left."""

    def __init__(
        self, *, pool: asyncpg.Pool, schema: str, route: str, executor: Executor, interval: float
    ) -> None:
        self._pool = pool
        self._schema = schema
        self._route = route
        self._executor = executor
        self._interval = interval

    async def scan_once(self) -> int:
        """One scan; returns how many executions this worker took over."""
        ex = self._executor
        if ex.slots.locked():
            return 0
        async with self._pool.acquire() as conn:
            orphans = await ledger.open_orphans(conn, self._schema, self._route, ex.worker_id, ex.concurrency)
        claimed = 0
        for execution_id, dead_owner in orphans:
            if ex.slots.locked():
                break
            await ex.slots.acquire()
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
                ex.slots.release()
                raise
            if row is None:  # another worker claimed it first, or the owner came back
                ex.slots.release()
                continue
            log.info(
                "execution_claimed",
                execution_id=execution_id,
                dead_owner=dead_owner,
                status=row.status.value,
            )
            ex.launch(execution_id, partial(ex.recover, row))
            claimed += 1
        return claimed

    async def check_alive(self) -> None:
        """Raise StaleOwnerError if other workers would now take this worker for dead.

        That happens when the liveness session ended while the process lives on (a database
        restart, a cut connection). Going on would mean two owners for the same work, so the
        process stops instead (and is restarted by whatever runs it).
        """
        async with self._pool.acquire() as conn:
            alive = await ledger.worker_alive(conn, self._schema, self._executor.worker_id)
        if not alive:
            raise StaleOwnerError(
                f"worker {self._executor.worker_id} lost its liveness lock, so other workers "
                "treat it as dead and may take over its executions; stopping"
            )

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
