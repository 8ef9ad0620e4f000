"""The typed boundary between the stores and the database: what a connection and a pool offer.

asyncpg's ``Connection`` and ``Pool`` offer it on PostgreSQL, ``infra.db.sqlite``'s on SQLite; the
stores are written against these protocols only, so the type checker checks every statement's
call (not its SQL: the conformance tests run the same statements on both backends).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

# A row as a statement returns it: columns by name (asyncpg's Record, SQLite's row).
Row = Mapping[str, Any]


class Connection(Protocol):
    """One database session, inside or outside a transaction."""

    async def fetch(self, query: str, *args: Any) -> Sequence[Row]: ...

    async def fetchrow(self, query: str, *args: Any) -> Row | None: ...

    async def fetchval(self, query: str, *args: Any) -> Any: ...

    async def execute(self, query: str, *args: Any) -> str: ...

    async def executemany(self, query: str, args: Iterable[Sequence[Any]]) -> Any: ...

    def transaction(self, *, isolation: str | None = None, readonly: bool = False) -> Any: ...


class Pool(Protocol):
    """Where connections come from; the dialect its statements are run in (``infra.db.dialect``)."""

    def acquire(self) -> Any: ...

    async def release(self, connection: Any) -> Any: ...

    async def close(self) -> None: ...
