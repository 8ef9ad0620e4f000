"""The backends of liveness (``infra.liveness``): where a worker's row lives and what stands for
its lock.

- :class:`WorkerRegistration`: PostgreSQL; a dedicated connection holds the worker's session
  advisory lock, which a dead process loses the moment its socket closes.
- :class:`LocalWorkerRegistration`: the embedded mode (SQLite); one process owns the data
  directory, so the rows stamped with this process's boot id are the live ones.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from infra.db.postgres import init_connection, lock_class, session_name, session_settings
from infra.liveness import REGISTER_SQL, Liveness, lock_held_sql
from infra.process.logging import get_logger

log = get_logger(__name__)


# The sessions named after dead workers (``infra.db.session_name``), ended.
_END_SESSIONS = """SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                    WHERE application_name = ANY($1::text[]) AND pid <> pg_backend_pid()
                      AND pg_has_role(usesysid, 'USAGE')"""


class WorkerRegistration(Liveness):
    """The PostgreSQL backend: a dedicated connection holding the worker's advisory lock."""

    def __init__(self, dsn: str, schema: str, kind: str, **options: Any) -> None:
        super().__init__(kind, **options)
        self._dsn = dsn
        self._schema = schema
        self.held_sql = lock_held_sql(schema, "workers")
        self.gone_sql = "id = ANY($3::text[])"
        self._connection: asyncpg.Connection | None = None
        self._lock_key = 0
        self._holding = False

    async def _connect(self) -> asyncpg.Connection:
        conn = await asyncpg.connect(
            self._dsn,
            timeout=10,
            server_settings={
                **session_settings(self._schema),
                "application_name": session_name(self.worker_id),
            },
        )
        await init_connection(conn)  # a death it records hands work back, journal entries included
        # A lost session is taken again at once: the grace is the others' patience, not ours.
        conn.add_termination_listener(lambda _: self._nudged.set())
        return conn

    async def _register(self) -> None:
        conn = await self._connect()
        try:
            self._lock_key = await conn.fetchval("SELECT nextval('worker_lock_seq')::int")
            await conn.execute("SELECT pg_advisory_lock($1, $2)", lock_class(self._schema), self._lock_key)
            await conn.execute(REGISTER_SQL, self.worker_id, self.kind, self._lock_key, self.lease_seconds)
        except BaseException:
            await conn.close()
            raise
        self._connection, self._holding = conn, True

    async def _ensure(self) -> bool:
        retaken = False
        if self._connection is None or self._connection.is_closed():
            if self._connection is not None:
                log.warning("liveness_connection_lost", worker=self.worker_id)
            self._connection, self._holding = None, False
            self._connection = await self._connect()
            retaken = True
        if not self._holding:
            # The old session may still hold it (the server has not noticed that it is gone):
            # the row is renewed meanwhile, and the lock is taken once that session ends.
            self._holding = bool(
                await self._connection.fetchval(
                    "SELECT pg_try_advisory_lock($1, $2)", lock_class(self._schema), self._lock_key
                )
            )
        return retaken

    async def _end_sessions(self, conn: Any, dead: list[str]) -> int:
        # Those of the role's sessions it may end (the same role, as Tendon's processes use);
        # PostgreSQL ends them at once, and their transactions' locks go with them.
        ended = await conn.fetchval(_END_SESSIONS, [session_name(w) for w in dead])
        return int(ended or 0)

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[asyncpg.Connection]:
        conn = self._connection
        assert conn is not None
        async with conn.transaction():
            yield conn

    async def _close(self, *, broken: bool = False) -> None:
        conn, self._connection, self._holding = self._connection, None, False
        if conn is None:
            return
        if broken:
            conn.terminate()  # it may be stuck mid-statement: drop it, a new one takes over
            return
        # Closing the session releases the lock (after a retire nobody needs it any more).
        with contextlib.suppress(Exception):
            await conn.close()


class LocalWorkerRegistration(Liveness):
    """The embedded backend: a row stamped with this process's boot id, on the store's pool."""

    def __init__(self, pool: Any, kind: str, **options: Any) -> None:
        options["grace"] = 0.0  # another boot's worker is gone for sure: nobody reconnects
        super().__init__(kind, **options)
        self.death_level = logging.INFO  # the workers of the process before this one: expected
        self._pool = pool
        self.held_sql = f"(lock_key = {int(pool.boot_id)})"
        self.gone_sql = "id IN (SELECT value FROM json_each($3))"

    async def _register(self) -> None:
        await self._pool.execute(
            REGISTER_SQL, self.worker_id, self.kind, self._pool.boot_id, self.lease_seconds
        )

    async def _ensure(self) -> bool:
        return False

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Any]:
        async with self._pool.acquire() as conn, conn.transaction():
            yield conn

    async def _close(self, *, broken: bool = False) -> None:
        return None
