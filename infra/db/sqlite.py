"""SQLite behind the same small connection API the stores use on PostgreSQL (asyncpg).

The embedded mode runs the stores' portable SQL (``brain/store``, ``hands/store``) on a SQLite
file: this module gives them ``acquire``/``transaction``/``fetch``/``fetchrow``/``fetchval``/
``execute``/``executemany``, turns ``$1`` placeholders into SQLite's ``?1`` (nothing else is
rewritten: what differs between the dialects is the stores' business), and registers the
functions the portable SQL calls: ``now()``, ``clock_timestamp()``, ``ts_add(t, seconds)`` and
``pg_notify(channel, payload)`` (which wakes in-process listeners at commit).

Timestamps are stored as UTC text with millisecond precision (the format SQLite's own
``strftime('%Y-%m-%dT%H:%M:%f')`` gives), so comparing them as text compares instants.
Columns declared ``jsonb``/``timestamptz``/``boolean`` are decoded like asyncpg does.
One connection on one thread serves the process; an asyncio lock hands it out, which
also makes every transaction exclusive.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

from infra.db import Json
from protocol import codec

DIALECT = "sqlite"
_TS_FORMAT = "%Y-%m-%dT%H:%M:%S"


def format_ts(moment: datetime) -> str:
    moment = moment.astimezone(UTC) if moment.tzinfo else moment
    return moment.strftime(_TS_FORMAT) + f".{moment.microsecond // 1000:03d}"


def parse_ts(text: str | bytes) -> datetime:
    if isinstance(text, bytes):
        text = text.decode()
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def _now() -> str:
    return format_ts(datetime.now(UTC))


def _ts_add(ts: str | None, seconds: float | None) -> str | None:
    if ts is None or seconds is None:
        return None
    return format_ts(parse_ts(ts) + timedelta(seconds=float(seconds)))


sqlite3.register_converter("jsonb", json.loads)
sqlite3.register_converter("json", json.loads)
sqlite3.register_converter("timestamptz", parse_ts)
sqlite3.register_converter("boolean", lambda b: b not in (b"0", b""))
sqlite3.register_adapter(dict, lambda v: codec.dumps(v).decode())
sqlite3.register_adapter(codec.Encoded, lambda v: v.raw.decode())  # adapters match the exact type
sqlite3.register_adapter(list, lambda v: codec.dumps(v).decode())
sqlite3.register_adapter(Json, lambda v: codec.dumps(v.value).decode())
sqlite3.register_adapter(datetime, format_ts)
sqlite3.register_adapter(bool, int)

_PARAM = re.compile(r"\$(\d+)")


@functools.lru_cache(maxsize=1024)
def placeholders(sql: str) -> str:
    """``$1`` -> ``?1``: SQLite's spelling of a numbered parameter (``$1`` would be a named one)."""
    return _PARAM.sub(r"?\1", sql)


def split_script(script: str) -> list[str]:
    """Split SQL text into complete statements (trigger bodies stay whole)."""
    statements, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            if current.strip():
                statements.append(current.strip())
            current = ""
    if current.strip():
        statements.append(current.strip())
    return statements


class SqliteConnection:
    """The asyncpg connection methods the stores use, on one shared sqlite3 connection."""

    dialect = DIALECT

    def __init__(self, pool: SqlitePool) -> None:
        self._pool = pool

    @property
    def boot_id(self) -> int:
        return self._pool.boot_id

    async def _run(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool._thread, fn)

    async def execute(self, sql: str, *args: Any) -> str:
        raw = self._pool._raw
        if not args and ";" in sql.strip().rstrip(";"):
            # A script (a migration): run statement by statement inside the caller's
            # transaction; sqlite3's executescript would COMMIT first.
            for statement in split_script(sql):
                await self._run(functools.partial(raw.execute, statement))
            return "OK"
        cur = await self._run(lambda: raw.execute(placeholders(sql), args))
        return f"OK {cur.rowcount}"

    async def executemany(self, sql: str, args: Sequence[Sequence[Any]]) -> None:
        raw = self._pool._raw
        await self._run(lambda: raw.executemany(placeholders(sql), args))

    async def fetch(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        raw = self._pool._raw
        return await self._run(lambda: raw.execute(placeholders(sql), args).fetchall())  # type: ignore[no-any-return]

    async def fetchrow(self, sql: str, *args: Any) -> sqlite3.Row | None:
        raw = self._pool._raw
        return await self._run(lambda: raw.execute(placeholders(sql), args).fetchone())  # type: ignore[no-any-return]

    async def fetchval(self, sql: str, *args: Any) -> Any:
        row = await self.fetchrow(sql, *args)
        return None if row is None else row[0]

    def transaction(self) -> _Transaction:
        return _Transaction(self)


class _Transaction:
    def __init__(self, conn: SqliteConnection) -> None:
        self._conn = conn

    async def __aenter__(self) -> None:
        # IMMEDIATE takes the write lock up front: no two transactions interleave.
        await self._conn._run(lambda: self._conn._pool._raw.execute("BEGIN IMMEDIATE"))

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        raw = self._conn._pool._raw
        # Shielded: a cancel arriving now must not leave the shared connection mid-transaction.
        await asyncio.shield(self._conn._run(lambda: raw.execute("ROLLBACK" if et else "COMMIT")))
        if et is None:
            self._conn._pool._deliver_notifications()
        else:
            self._conn._pool._pending.clear()


class _Acquire:
    """``await pool.acquire()`` and ``async with pool.acquire()``, as with asyncpg."""

    def __init__(self, pool: SqlitePool) -> None:
        self._pool = pool
        self._conn: SqliteConnection | None = None

    def __await__(self):  # type: ignore[no-untyped-def]
        return self._take().__await__()

    async def _take(self) -> SqliteConnection:
        await self._pool._lock.acquire()
        return SqliteConnection(self._pool)

    async def __aenter__(self) -> SqliteConnection:
        self._conn = await self._take()
        return self._conn

    async def __aexit__(self, *exc: object) -> None:
        assert self._conn is not None
        await self._pool.release(self._conn)


class SqlitePool:
    """One SQLite file used like an asyncpg pool (``dialect`` tells the two apart)."""

    dialect = DIALECT

    def __init__(self, path: Path) -> None:
        self.path = path
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sqlite:{path.name}")
        self._lock = asyncio.Lock()
        self._raw: sqlite3.Connection = None  # type: ignore[assignment]
        self._listeners: dict[str, list[Callable[..., Any]]] = {}
        self._pending: list[str] = []
        self.boot_id = 0  # set when the file is opened

    async def open(self) -> SqlitePool:
        loop = asyncio.get_running_loop()
        self._raw = await loop.run_in_executor(self._thread, self._connect)
        return self

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        raw = sqlite3.connect(
            self.path,
            detect_types=sqlite3.PARSE_DECLTYPES,
            isolation_level=None,
            check_same_thread=False,
        )
        raw.row_factory = sqlite3.Row
        raw.execute("PRAGMA journal_mode=WAL")
        raw.execute("PRAGMA synchronous=FULL")  # a commit must survive SIGKILL and power loss
        raw.execute("PRAGMA busy_timeout=10000")
        # No foreign-key checks: integrity by construction, as on PostgreSQL (brain migration 9).
        raw.execute("PRAGMA foreign_keys=OFF")
        raw.create_function("now", 0, _now)
        raw.create_function("clock_timestamp", 0, _now)
        raw.create_function("ts_add", 2, _ts_add)
        raw.create_function("pg_notify", 2, self._queue_notification)
        # Each opening of the file gets a new boot id (kept in the file, so never reused):
        # workers stamped with an older one belong to a process that is gone.
        raw.execute("BEGIN IMMEDIATE")
        self.boot_id = raw.execute("PRAGMA user_version").fetchone()[0] + 1
        raw.execute(f"PRAGMA user_version = {int(self.boot_id)}")
        raw.execute("COMMIT")
        return raw

    def _queue_notification(self, channel: str, payload: str) -> None:
        self._pending.append(channel)

    def _deliver_notifications(self) -> None:
        # Like PostgreSQL, a notification is delivered only once its transaction commits.
        pending, self._pending = self._pending, []
        for channel in pending:
            for callback in self._listeners.get(channel, []):
                callback(None, 0, channel, "")

    async def add_listener(self, channel: str, callback: Callable[..., Any]) -> None:
        self._listeners.setdefault(channel, []).append(callback)

    def acquire(self) -> _Acquire:
        return _Acquire(self)

    async def release(self, conn: SqliteConnection) -> None:
        try:
            # A holder cancelled between BEGIN and COMMIT left a transaction open: whatever
            # it did is not committed, and the next holder must start clean.
            await asyncio.shield(
                asyncio.get_running_loop().run_in_executor(self._thread, self._rollback_leftover)
            )
        finally:
            self._deliver_notifications()  # notifications sent outside a transaction
            self._lock.release()

    def _rollback_leftover(self) -> None:
        if self._raw.in_transaction:
            self._raw.execute("ROLLBACK")
            self._pending.clear()

    async def execute(self, sql: str, *args: Any) -> str:
        async with self.acquire() as conn:
            return await conn.execute(sql, *args)

    async def fetch(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        async with self.acquire() as conn:
            return await conn.fetch(sql, *args)

    async def fetchrow(self, sql: str, *args: Any) -> sqlite3.Row | None:
        async with self.acquire() as conn:
            return await conn.fetchrow(sql, *args)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        async with self.acquire() as conn:
            return await conn.fetchval(sql, *args)

    async def close(self) -> None:
        if self._raw is not None:
            raw = self._raw
            await asyncio.get_running_loop().run_in_executor(self._thread, raw.close)
        self._thread.shutdown(wait=True)


async def open_pool(path: Path) -> SqlitePool:
    """Open (creating if needed) the SQLite file at ``path``."""
    return await SqlitePool(path).open()
