"""What every store shares (the Brain store's parts and the Hands ledger): its pool, its one
transaction helper, and the few spellings in which the portable SQL depends on the backend
(fragments, not branches).

The portable parts are written in the SQL both backends run: ``$n`` parameters, ``RETURNING``,
``ON CONFLICT``, ``now()`` and ``ts_add(t, seconds)`` (a function each backend defines). What
PostgreSQL can do faster (one statement instead of several, arrays instead of loops) its backend
overrides; callers never ask which one they have.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

from infra.db import reading, transact
from infra.db.connection import Connection, Pool
from infra.db.held import HeldConnection
from infra.db.sqlite import parse_ts

T = TypeVar("T")


class StoreBase:
    """The pool and the spellings; the base of every store backend."""

    # A row lock where a read decides a write. SQLite needs none: every transaction there
    # holds the database's write lock from its start (BEGIN IMMEDIATE).
    FOR_UPDATE = ""
    SKIP_LOCKED = ""
    # Whether one data-changing statement commits on its own, all or nothing, so that work made
    # of exactly one such statement needs no BEGIN and COMMIT around it.
    ONE_STATEMENT_COMMITS = False
    # Whether a user that commits one transaction at a time may keep a connection between them.
    HOLDS_CONNECTIONS = False

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def transact(
        self, work: Callable[[Connection], Awaitable[T]], *, single_statement: bool = False, **options: Any
    ) -> T:
        """``infra.db.transact`` on this store's pool; ``single_statement`` only where it holds here."""
        return await transact(
            self.pool, work, single_statement=single_statement and self.ONE_STATEMENT_COMMITS, **options
        )

    def held(self) -> HeldConnection | None:
        """A connection to keep between transactions (``transact(..., held=)``), where the backend
        pools them; None where it does not."""
        return HeldConnection(self.pool) if self.HOLDS_CONNECTIONS else None

    async def read_consistent(self, work: Callable[[Connection], Awaitable[T]]) -> T:
        """``work(conn)`` with every read seeing the same moment (a snapshot and its cursor). A
        transaction is that here: the backend runs one at a time (SQLite)."""
        return await self.transact(work)

    async def read(self, work: Callable[[Connection], Awaitable[T]]) -> T:
        """``work(conn)`` on a pooled connection, outside any transaction (reads only)."""
        async with reading(self.pool) as conn:
            return await work(conn)

    async def close(self) -> None:
        await self.pool.close()


def as_time(value: Any) -> datetime:
    """A timestamp an expression returned (``now() AS now``): SQLite gives its text form, which
    no column type converts."""
    return value if isinstance(value, datetime) else parse_ts(value)
