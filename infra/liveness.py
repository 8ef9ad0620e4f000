"""Owner liveness through PostgreSQL session advisory locks.

Every Brain or Hands process registers a row in its schema's ``workers`` table and holds
an advisory lock on a dedicated connection for as long as it lives. When the process dies
(even by SIGKILL) the kernel closes its socket, PostgreSQL ends the session and the lock is
gone at once, so others can tell a dead owner in one query instead of waiting out a lease.

Each schema that uses this needs (created by its migrations)::

    CREATE SEQUENCE worker_lock_seq;
    CREATE TABLE workers (id text PRIMARY KEY, kind text NOT NULL,
                          lock_key int NOT NULL, started_at timestamptz NOT NULL DEFAULT now());
"""

from __future__ import annotations

import os
import socket
from types import TracebackType
from typing import Any

import asyncpg

from infra.db import lock_class
from protocol import new_id

# Used in WHERE clauses; ``w`` must be the workers row of the owner being checked.
OWNER_ALIVE_SQL = """EXISTS (
    SELECT 1 FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = $LOCK_CLASS::oid AND l.objid = w.lock_key::oid AND l.objsubid = 2)"""


def owner_alive_sql(schema: str, db: Any = None) -> str:
    """The liveness predicate for ``w`` (a workers row), for the database ``db`` is on.

    On the embedded SQLite store one process owns the data directory (it holds a file
    lock), so exactly the workers registered since this process opened it are alive.
    """
    boot_id = getattr(db, "boot_id", None)
    if boot_id is not None:
        return f"(w.lock_key = {int(boot_id)})"
    return OWNER_ALIVE_SQL.replace("$LOCK_CLASS", str(lock_class(schema)))


async def worker_alive(conn: asyncpg.Connection, schema: str, worker_id: str) -> bool:
    """Whether others would take ``worker_id`` for alive right now."""
    return bool(
        await conn.fetchval(
            f"SELECT {owner_alive_sql(schema, conn)} FROM workers w WHERE w.id = $1", worker_id
        )
    )


class WorkerRegistration:
    """``async with WorkerRegistration(dsn, schema, kind) as reg``: ``reg.worker_id`` is alive."""

    def __init__(self, dsn: str, schema: str, kind: str) -> None:
        self._dsn = dsn
        self._schema = schema
        self.kind = kind
        self.worker_id = f"{kind}-{socket.gethostname()}-{os.getpid()}-{new_id()[:6]}"
        self._conn: asyncpg.Connection | None = None

    async def __aenter__(self) -> WorkerRegistration:
        conn = await asyncpg.connect(self._dsn, server_settings={"search_path": self._schema})
        try:
            lock_key = await conn.fetchval("SELECT nextval('worker_lock_seq')::int")
            await conn.execute("SELECT pg_advisory_lock($1, $2)", lock_class(self._schema), lock_key)
            await conn.execute(
                "INSERT INTO workers (id, kind, lock_key) VALUES ($1, $2, $3)",
                self.worker_id,
                self.kind,
                lock_key,
            )
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._conn is not None:
            # Closing the session releases the lock: the same signal a crash gives, on purpose.
            await self._conn.close()
            self._conn = None


class LocalWorkerRegistration:
    """The embedded-mode registration: a row stamped with this process's boot id."""

    def __init__(self, pool: Any, kind: str) -> None:
        self._pool = pool
        self.kind = kind
        self.worker_id = f"{kind}-{socket.gethostname()}-{os.getpid()}-{new_id()[:6]}"

    async def __aenter__(self) -> LocalWorkerRegistration:
        await self._pool.execute(
            "INSERT INTO workers (id, kind, lock_key) VALUES ($1, $2, $3)",
            self.worker_id,
            self.kind,
            self._pool.boot_id,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None
