"""The one transaction helper, the one way to read outside it, and the one way a loop rides out a
lost database: what a passing fault is, retried where nothing can have committed."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from infra.db.held import HeldConnection
from infra.process.logging import get_logger
from protocol import TransientError

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
# What asyncpg says about a connection whose session the server ended while it was idle (a
# PostgreSQL shutdown or restart, an administrator's pg_terminate_backend): the server's last
# message put it in a state that waits for an answer that never comes, so until its socket is
# seen closed, the next statement on it fails with an InternalClientError ("cannot switch to
# state 12; another operation (2) is in progress"). The connection is lost, only not closed yet.
_WEDGED = "cannot switch to state"
# SQLSTATE classes that a later attempt may not hit: connection, resources, operator
# intervention (e.g. a restart), transaction rollback.
_TRANSIENT_SQLSTATE_CLASSES = ("08", "40", "53", "57", "58")


# Tries of a transaction that certainly did not commit, before its error goes to the caller.
TRANSACT_ATTEMPTS = 5


class _NotStarted(Exception):
    """The transaction never began (no connection): retrying cannot double-apply anything."""


# SQLite's passing faults: another process holds the file, the disk is full or failing.
_SQLITE_TRANSIENT = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_FULL", "SQLITE_IOERR")


def wedged(exc: BaseException) -> bool:
    """Whether ``exc`` is asyncpg refusing a connection whose session the server ended (``_WEDGED``):
    that connection must be dropped (``terminate``), or the pool hands it out again."""
    return isinstance(exc, asyncpg.InternalClientError) and str(exc).startswith(_WEDGED)


# SQLSTATEs of a session the server ends: an administrator's or a shutdown's (57P01), a crash's
# (57P02), and every connection exception (class 08).
_SESSION_ENDED = ("57P01", "57P02", "08")


def drop_wedged(conn: Any, exc: BaseException) -> None:
    """Drop ``conn`` when ``exc`` says it is wedged (``wedged``), so that its pool replaces it."""
    if wedged(exc):
        with contextlib.suppress(asyncpg.InterfaceError):  # handed back by asyncpg on its own since
            conn.terminate()


def _lost_during(conn: Any, exc: BaseException) -> TransientError:
    """What a transaction whose connection was lost raises: the commit may or may not have
    happened. A wedged connection is dropped first."""
    drop_wedged(conn, exc)
    return TransientError(f"database connection lost during a transaction (outcome unknown): {exc}")


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection it came from is gone (closed, or ended by the server)."""
    state = getattr(exc, "sqlstate", None)
    ended = isinstance(state, str) and state.startswith(_SESSION_ENDED)
    return ended or isinstance(exc, _CONNECTION_LOST) or wedged(exc)


def is_transient(exc: BaseException) -> bool:
    """Whether a database error may go away on its own (vs. bad data or a bug)."""
    if isinstance(exc, (*_ROLLED_BACK, TransientError)) or connection_lost(exc):
        return True
    if isinstance(exc, sqlite3.OperationalError):
        return str(getattr(exc, "sqlite_errorname", "")).startswith(_SQLITE_TRANSIENT)
    state = getattr(exc, "sqlstate", None)
    return isinstance(state, str) and state[:2] in _TRANSIENT_SQLSTATE_CLASSES


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
            except Exception as exc:
                if not connection_lost(exc):
                    raise
                raise _lost_during(conn, exc) from exc
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
            try:
                yield conn
            except Exception as exc:
                drop_wedged(conn, exc)  # before the pool takes it back
                raise
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
