"""PostgreSQL edges: one pool factory, one transaction helper, one migration runner."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sqlite3
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import asyncpg

from infra.held import HeldConnection
from infra.logging import get_logger
from protocol import TransientError, codec

T = TypeVar("T")
log = get_logger(__name__)

# Errors after which the transaction certainly did not commit: safe to run it again.
_ROLLED_BACK = (asyncpg.SerializationError, asyncpg.DeadlockDetectedError)
# Errors that mean the connection broke: before BEGIN it is safe to retry, after it the
# outcome of COMMIT is unknown and the caller must decide (it gets a TransientError).
_CONNECTION_LOST = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    ConnectionError,
    OSError,
)
# SQLSTATE classes that a later attempt may not hit: connection, resources, operator
# intervention (e.g. a restart), transaction rollback.
_TRANSIENT_SQLSTATE_CLASSES = ("08", "40", "53", "57", "58")


# Tries of a transaction that certainly did not commit, before its error goes to the caller.
TRANSACT_ATTEMPTS = 5


class _NotStarted(Exception):
    """The transaction never began (no connection): retrying cannot double-apply anything."""


# SQLite's passing faults: another process holds the file, the disk is full or failing.
_SQLITE_TRANSIENT = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_FULL", "SQLITE_IOERR")


def is_transient(exc: BaseException) -> bool:
    """Whether a database error may go away on its own (vs. bad data or a bug)."""
    if isinstance(exc, (*_CONNECTION_LOST, *_ROLLED_BACK, TransientError)):
        return True
    if isinstance(exc, sqlite3.OperationalError):
        return str(getattr(exc, "sqlite_errorname", "")).startswith(_SQLITE_TRANSIENT)
    state = getattr(exc, "sqlstate", None)
    return isinstance(state, str) and state[:2] in _TRANSIENT_SQLSTATE_CLASSES


def unstorable(value: Any) -> str | None:
    """Why PostgreSQL cannot store ``value`` as text or jsonb (a NUL character, or a lone
    surrogate that is no Unicode at all), or None when it can. SQLite keeps the same rule, so
    that both stores refuse the same input."""
    if isinstance(value, str):
        if "\x00" in value:
            return "contains a NUL character (\\u0000)"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "contains a lone surrogate, which is not valid Unicode"
        return None
    if isinstance(value, dict):
        items: list[Any] = [*value.keys(), *value.values()]
        return next((p for p in map(unstorable, items) if p), None)
    if isinstance(value, list | tuple):
        return next((p for p in map(unstorable, value) if p), None)
    return None


def storable(text: str, limit: int = 2000) -> str:
    """``text`` as PostgreSQL text and jsonb accept it (they refuse NUL characters and lone
    surrogates), at most ``limit`` characters: a saved error must never fail for the very
    reason it reports."""
    safe = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return safe if len(safe) <= limit else safe[:limit] + "…"


def describe(exc: BaseException) -> str:
    """``Type: message`` of an error, storable (what a row or a fact says went wrong)."""
    text = str(exc)
    return storable(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


class Json:
    """A value bound for a JSON column that may be a bare string or number.

    PostgreSQL knows a parameter's column type; SQLite does not, and would store a bare
    string as text that no longer reads back as JSON. Wrapping says "encode me as JSON".
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def as_json(value: Any) -> Any:
    """``value`` bound as JSON (None stays NULL): also what an element of a jsonb[] parameter must
    be, where a list would read as one more array dimension."""
    return value if value is None or isinstance(value, Json) else Json(value)


def _encode_json(value: Any) -> str:
    return codec.dumps(value.value if isinstance(value, Json) else value).decode("utf-8")


async def init_connection(conn: asyncpg.Connection) -> None:
    """What every Tendon connection speaks: JSON for json and jsonb, through the one codec."""
    for typename in ("json", "jsonb"):
        await conn.set_type_codec(
            typename,
            encoder=_encode_json,
            decoder=json.loads,
            schema="pg_catalog",
        )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool connections carry no session state (no LISTEN, SET or session locks): asyncpg
    still rolls back an open transaction on release, so the reset query's round trip on
    every release is skipped."""


# No Tendon transaction waits on anything but its own statements (model calls and tool bodies run
# outside them), so one left idle this long belongs to a process that stopped (SIGSTOP, a frozen
# VM) between two of its statements: the server ends that session, and the row locks it held no
# longer keep the others from declaring it dead and taking its work over (invariant 10). A
# process that was only slow finds its connection gone: a passing fault, ridden out.
IDLE_IN_TRANSACTION = 10.0  # seconds


def session_settings(schema: str, idle_in_transaction: float = IDLE_IN_TRANSACTION) -> dict[str, str]:
    """What every session that runs Tendon's transactions (the pools, the liveness connection)
    sets on the server: its schema, and how long it may leave a transaction idle."""
    return {
        "search_path": schema,
        "idle_in_transaction_session_timeout": str(max(1, round(idle_in_transaction * 1000))),
    }


async def create_pool(dsn: str, schema: str, *, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    """A pool whose connections work inside ``schema`` and speak JSON for json/jsonb."""
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=init_connection,
        reset=_keep_session,
        server_settings={
            **session_settings(schema),
            "application_name": f"tendon:{schema}",
            # Tendon's statements are prepared once per connection and run with arrays and ids
            # whose values do not change the best plan: planning each execution anew (what
            # PostgreSQL does for a statement's first five runs, and often after) is wasted.
            "plan_cache_mode": "force_generic_plan",
            # The rows Tendon's statements touch are the hot ones, in memory: an index probe costs
            # about a page read in order, not four (PostgreSQL's default, made for disks; 1.1 is
            # what its manual suggests for such storage). With the default, a statement that looks
            # up a few rows by key read whole tables of a few hundred rows instead.
            "random_page_cost": "1.1",
        },
    )
    assert pool is not None
    return pool


async def transact(
    pool: asyncpg.Pool,
    work: Callable[[asyncpg.Connection], Awaitable[T]],
    *,
    single_statement: bool = False,
    read_then_insert: bool = False,
    held: HeldConnection | None = None,
) -> T:
    """Run ``work(conn)`` in one transaction; the one way Tendon commits a state change.

    A transaction that certainly did not commit (serialization failure, deadlock, no
    connection to begin with) is retried as a whole. A connection lost mid-transaction
    raises ``TransientError``: the commit may or may not have happened, so the caller
    re-reads the state instead of blindly doing the work twice. Business errors are never
    retried.

    ``single_statement``: ``work`` makes its change in one statement (reads aside), which the
    database commits on its own, so no BEGIN/COMMIT is sent around it: two round trips fewer.
    Only for work where that holds on the pool's backend.

    ``read_then_insert``: ``work`` looks a key up and inserts it when missing (an idempotent
    submit). Two such transactions racing on one key both miss it, and the later insert fails
    with a unique violation once the earlier one committed: that one is tried again too, and
    then finds the key.

    ``held``: take the connection from there, and give it back there (a group committer's).
    """
    retried = (*_ROLLED_BACK, _NotStarted, *((asyncpg.UniqueViolationError,) if read_then_insert else ()))
    # A plain loop, not a retry library: this runs for every commit (tenacity's machinery cost
    # 40-55 us a call, measured), and almost always once.
    for attempt in range(1, TRANSACT_ATTEMPTS + 1):
        try:
            try:
                conn = await (held.acquire() if held is not None else pool.acquire())
            except Exception as exc:
                # No connection, so nothing began: a server that is away, or one that refuses
                # another session for now ("too many clients", SQLSTATE 53300), is waited out.
                if not is_transient(exc):
                    raise
                raise _NotStarted(str(exc)) from exc
            try:
                if single_statement:
                    return await work(conn)
                async with conn.transaction():
                    return await work(conn)
            except _CONNECTION_LOST as exc:
                raise TransientError(
                    f"database connection lost during a transaction (outcome unknown): {exc}"
                ) from exc
            finally:
                await (held.release(conn) if held is not None else pool.release(conn))
        except retried as exc:
            if attempt == TRANSACT_ATTEMPTS:
                if isinstance(exc, _NotStarted):
                    raise TransientError(f"the database is unavailable for now: {exc}") from exc
                raise
            await asyncio.sleep(min(1.0, 0.05 * 2 ** (attempt - 1)) + random.uniform(0, 0.05))
    raise AssertionError("unreachable")  # pragma: no cover


@contextlib.asynccontextmanager
async def reading(pool: Any) -> AsyncIterator[Any]:
    """A pooled connection for reads outside ``transact``. A passing fault (no connection, the
    server refusing another session for now, the connection lost) reaches the caller as a
    ``TransientError``, as from ``transact``: the API answers 503, a loop waits it out."""
    try:
        async with pool.acquire() as conn:
            yield conn
    except TransientError:
        raise
    except Exception as exc:
        if not is_transient(exc):
            raise
        raise TransientError(f"the database is unavailable for now: {exc}") from exc


# How long work that meets a passing database fault waits for the database to come back
# before it gives up (a restart or a failover takes seconds, not minutes).
OUTAGE_PATIENCE = 120.0


async def patiently(
    work: Callable[[], Awaitable[T]], *, what: str, patience: float = OUTAGE_PATIENCE, **context: Any
) -> T:
    """Run ``work()``, trying again while it fails with a passing fault (``is_transient``), with
    backoff up to 2 s, for at most ``patience`` seconds; then the last error is raised.

    The one way a loop rides out a lost database (invariant 14): ``work`` must be safe to run
    again after a failure whose outcome is unknown (it re-reads, or its writes are guarded).
    A warning names ``what`` waits, at the first failure and every ten after.
    """
    deadline = asyncio.get_running_loop().time() + patience
    failures = 0
    while True:
        try:
            return await work()
        except Exception as exc:
            if not is_transient(exc) or asyncio.get_running_loop().time() >= deadline:
                raise
            failures += 1
            if failures % 10 == 1:
                log.warning(
                    "waiting_for_the_database", waiting=what, attempts=failures, error=repr(exc), **context
                )
            await asyncio.sleep(min(2.0, 0.05 * 2 ** min(failures, 6)))


def lock_class(schema: str) -> int:
    """A stable positive int32 for advisory locks that belong to ``schema``."""
    return zlib.crc32(schema.encode()) & 0x7FFFFFFF


def dialect(pool: Any) -> str:
    """``postgres`` for an asyncpg pool or connection, ``sqlite`` for infra.sqlite's. For the
    stores and this module only: everything above them asks a store for what it can do."""
    return str(getattr(pool, "dialect", "postgres"))


def migration_files(directory: Path, kind: str) -> list[tuple[int, Path]]:
    """The migrations of one dialect: ``<directory>/<kind>/NNNN_name.sql``, by version."""
    found = []
    for path in sorted((directory / kind).glob("*.sql")):
        version, _, _ = path.name.partition("_")
        if not version.isdigit():
            raise ValueError(f"migration {path} does not start with its version number")
        found.append((int(version), path))
    versions = [v for v, _ in found]
    if len(set(versions)) != len(versions):
        raise ValueError(f"two migrations of {directory / kind} share a version")
    return found


async def migrate(pool: Any, schema: str, directory: Path) -> int:
    """Apply the versioned SQL migrations of the pool's dialect in order, idempotently and
    safely from several processes; returns how many were applied now.

    Each migration runs in its own transaction together with its bookkeeping row; on
    PostgreSQL a transaction-level advisory lock serialises concurrent starts (SQLite's write
    lock does the same there).
    """
    kind = dialect(pool)
    steps = migration_files(directory, kind)
    postgres = kind == "postgres"
    table = f'"{schema}".schema_migrations' if postgres else "schema_migrations"
    applied = 0
    async with pool.acquire() as conn:
        async with conn.transaction():
            if postgres:
                await conn.execute("SELECT pg_advisory_xact_lock($1, 0)", lock_class(schema))
                await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {table} ("
                " version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
                if postgres
                else f"CREATE TABLE IF NOT EXISTS {table} (version int PRIMARY KEY)"
            )
        for version, path in steps:
            async with conn.transaction():
                if postgres:
                    await conn.execute("SELECT pg_advisory_xact_lock($1, 0)", lock_class(schema))
                if await conn.fetchval(f"SELECT 1 FROM {table} WHERE version = $1", version):
                    continue
                await conn.execute(path.read_text())
                await conn.execute(f"INSERT INTO {table} (version) VALUES ($1)", version)
                applied += 1
    return applied


# ---- statistics of young tables ---------------------------------------------------------


async def analyze_grown(pool: Any, *, floor: int = 100) -> list[str]:
    """ANALYZE the tables of the pool's schema that hold at least ``floor`` rows and at least
    twice as many as their statistics say (so a growing table is analyzed at each doubling).
    Returns the tables analyzed.

    Why: every statement is prepared once per connection, and PostgreSQL may settle on one
    generic plan for a prepared statement after its fifth run. A plan settled while a table
    was nearly empty stays until the table is analyzed again, which autovacuum does only
    after its next nap (a minute by default). A fresh deployment's first burst grows tables
    from nothing to thousands of rows in seconds and meanwhile runs on plans made for ten:
    measured, the Hands relay's scan for due events took 12.5 s per call at 30,000 events
    (20 ms with a fresh plan) and the relay stood still for 40 s. Analyzing a young table
    takes milliseconds and makes PostgreSQL plan its statements again. Once tables are big,
    autovacuum's own threshold (10 % of the rows changed) comes long before a doubling. The
    floor is low because small tables matter too: a plan made for a table of one page reads
    the table whole, which at a few hundred rows cost a lone turn's statements 0.1 ms and more.
    """
    if dialect(pool) != "postgres":
        return []  # SQLite plans each statement with what it knows at the time
    async with pool.acquire() as conn:
        tables = [
            r["relname"]
            for r in await conn.fetch(
                """SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
                    WHERE s.schemaname = current_schema()
                      AND s.n_live_tup >= greatest($1::float8, 2 * c.reltuples)
                      AND pg_has_role(c.relowner, 'USAGE')  -- only an owner may analyze""",
                floor,
            )
        ]
        for table in tables:
            await conn.execute(f'ANALYZE "{table}"')
    return tables


async def keep_statistics(pool: Any, interval: float = 5.0, *, floor: int = 100) -> None:
    """Run :func:`analyze_grown` every ``interval`` seconds, forever; failures are logged."""
    while True:
        await asyncio.sleep(interval)
        try:
            analyzed = await analyze_grown(pool, floor=floor)
        except Exception as exc:  # noqa: BLE001 - only a help to the planner
            log.warning("analyze_failed", error=repr(exc))
        else:
            if analyzed:
                log.info("tables_analyzed", tables=analyzed)
