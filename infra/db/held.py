"""A pooled connection that a group committer keeps between its transactions
(``infra.db.transact(..., held=)``)."""

from __future__ import annotations

import asyncio

import asyncpg


class HeldConnection:
    """A pooled connection kept between the transactions of one user that runs them one at a
    time (a group committer): no acquire and release per commit (asyncpg's release alone takes a
    task and three turns of the event loop; -0.06 ms on a lone turn's span and +2.8 % calls/s at
    50 in flight, twenty-eighth round).

    A broken connection, or one left in a transaction, goes back to the pool (which closes or
    rolls it back); one left unused for ``idle`` seconds goes back too, so that a pool closing
    (which waits for every connection) waits that long at most.
    """

    def __init__(self, pool: asyncpg.Pool, idle: float = 0.25) -> None:
        self.pool = pool
        self.idle = idle
        self._conn: asyncpg.Connection | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._returning: asyncio.Future[None] | None = None  # a connection on its way back

    async def acquire(self) -> asyncpg.Connection:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        conn, self._conn = self._conn, None
        if conn is not None and not _broken(conn):
            return conn
        if conn is not None:
            await self.pool.release(conn)
        return await self.pool.acquire()

    async def release(self, conn: asyncpg.Connection) -> None:
        # One is kept at most: a second user at the same moment (its owner runs one transaction
        # at a time, but nothing here relies on that) gives its connection back to the pool.
        if _broken(conn) or conn.is_in_transaction() or self._conn is not None:
            await self.pool.release(conn)
            return
        self._conn = conn
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(self.idle, self._let_go)

    async def close(self) -> None:
        """Give the kept connection back now (an owner that stops before its pool closes)."""
        self._let_go()
        if self._returning is not None:
            await self._returning

    def _let_go(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        conn, self._conn = self._conn, None
        if conn is not None:
            self._returning = asyncio.ensure_future(self.pool.release(conn))


def _broken(conn: asyncpg.Connection) -> bool:
    """Whether ``conn`` is closed. A pooled connection whose session ended (the server's restart,
    an administrator) is handed back to its pool by asyncpg itself, and every call of its proxy
    then raises (releasing it again is a no-op): that one is closed too."""
    try:
        return conn.is_closed()
    except asyncpg.InterfaceError:
        return True
