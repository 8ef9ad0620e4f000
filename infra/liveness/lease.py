"""Liveness of Brain and Hands processes: a lease renewed in time, and a lock for a fast path.

Every process registers a row in its schema's ``workers`` table and keeps it alive:

- **the lease**: it renews ``lease_expires_at`` every third of ``lease_seconds``. An owner that
  stops renewing (SIGSTOP, a long pause, a half-open partition, a frozen VM) is presumed dead
  once its lease ran out, although its connection (and lock) may look fine for hours;
- **the lock**: it holds a PostgreSQL session advisory lock on a dedicated connection. A
  process that dies (even by SIGKILL) loses it the moment its socket closes, so it is seen
  dead after ``grace`` seconds instead of a whole lease. A lost connection loses the lock too:
  the process reconnects with backoff and takes it again; within ``grace`` nobody acts on it.

Death is a recorded fact, decided by the others (:meth:`Liveness.judge`, run by every settled
process every ``interval`` seconds) and never undone: ``dead_at`` is set once, in the same
transaction that hands the dead worker's work back (``release``: its turns or executions), so
its late commits are fenced at once; and before that hand-back, the same transaction ends the dead
worker's database sessions (each session a worker opens is named after it, ``infra.db.session_name``):
a process frozen mid-statement keeps the row locks of its transaction, which no timeout of the
server's releases (it is not idle in transaction), and the hand-back would wait for them forever.
A process that finds its own row dead (its renewal
matches nothing) sets :attr:`Liveness.lost`: it must stop its work, and may start over under
a new worker id. A process that stops cleanly retires its row the same way, so that its work
is taken over without waiting for anything.

A judge must not mistake a reconnecting peer for a dead one: it judges only once its own
liveness has been up for the grace (two seconds at most). After a database restart every
process reconnects within a second or so and takes its lock again before anyone judges.

A second witness makes a killed process's death immediate: every process also announces itself
on the broker with an exclusive queue (``Topology.presence``), which the broker deletes the
moment the process's connection closes. A lost lock whose process the broker no longer sees is
a death at once; a lost lock whose process the broker still sees (only its database connection
was cut, or the database restarted) gets the grace to be taken again. When the broker cannot
tell, the grace decides.

Each schema that uses this needs (created by its migrations)::

    CREATE SEQUENCE worker_lock_seq;
    CREATE TABLE workers (id text PRIMARY KEY, kind text NOT NULL, lock_key int NOT NULL,
                          started_at timestamptz NOT NULL DEFAULT now(),
                          lease_expires_at timestamptz, lock_lost_at timestamptz,
                          dead_at timestamptz);

The embedded mode (SQLite) has one process per data directory (it holds a file lock): the
workers of this process are the ones stamped with its boot id, and any other is dead at once.
The two backends (what holds the lock, where the row lives) are in ``infra.liveness.registrations``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from infra.db import Connection, lock_class
from infra.process.logging import get_logger
from infra.process.loops import BackgroundLoop, Backoff
from infra.transport import Transport
from protocol import StaleOwnerError, new_id

log = get_logger(__name__)

# Hands a dead worker's work back, inside the transaction that records its death.
# ``died``: False when the worker retires (a clean stop).
Release = Callable[[Any, list[str], bool], Awaitable[Any]]
# Renews what the worker (its id given) holds beside its own row (a Brain: its running turns).
Renew = Callable[[Any, str], Awaitable[Any]]

# A worker row that is alive in others' eyes; used in WHERE clauses where ``w`` is the row.
ALIVE_SQL = "(w.dead_at IS NULL)"
# Whatever is kept of a dead worker's row, for ``show`` commands, before it is deleted.
PRUNE_AFTER = 3600.0
PRUNE_EVERY = 60.0
# Reconnecting after a lost connection: at most this long between attempts (well below any
# sensible grace, so that a restarted database sees every process back in time).
RECONNECT_MAX_DELAY = 0.5
# How long a process waits after (re)taking its own liveness before it judges others: enough
# for everyone to reconnect after a database restart (the grace, when that is shorter).
SETTLE_AT_MOST = 2.0


def lock_held_sql(schema: str, alias: str) -> str:
    return f"""EXISTS (
        SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid = {lock_class(schema)}::oid AND l.objid = {alias}.lock_key::oid
          AND l.objsubid = 2)"""


def _judge_sql(held: str, gone: str) -> tuple[str, str, str]:
    """The statements of a judgement: note lost locks, list the workers whose lock is gone, and
    record deaths (returning their ids). ``gone`` (of ``$3``): the workers whose lock is gone and
    whose process the broker no longer sees: dead without waiting for the grace."""
    mark = f"""UPDATE workers SET lock_lost_at = now()
                WHERE dead_at IS NULL AND lock_lost_at IS NULL AND id <> $1 AND NOT {held}"""
    suspects = f"SELECT id FROM workers WHERE dead_at IS NULL AND id <> $1 AND NOT {held}"
    dead = f"""UPDATE workers SET dead_at = now()
                WHERE dead_at IS NULL AND id <> $1
                  AND (lease_expires_at < now()
                       OR ((ts_add(lock_lost_at, $2) < now() OR {gone})
                           AND NOT {held}))
            RETURNING id"""
    return mark, suspects, dead


_RENEW = """UPDATE workers SET lease_expires_at = ts_add(now(), $2), lock_lost_at = NULL
             WHERE id = $1 AND dead_at IS NULL RETURNING id"""
_RETIRE = "UPDATE workers SET dead_at = now() WHERE id = $1 AND dead_at IS NULL RETURNING id"
_PRUNE = "DELETE FROM workers WHERE ts_add(dead_at, $1) < now()"
REGISTER_SQL = """INSERT INTO workers (id, kind, lock_key, lease_expires_at)
               VALUES ($1, $2, $3, ts_add(now(), $4))"""


# A worker id's length at most: its sessions are named after it (``infra.db.session_name``), and
# PostgreSQL keeps 63 bytes of a session's name, "tendon:" included.
WORKER_ID_BYTES = 56


def new_worker_id(kind: str) -> str:
    """A new worker's id: its kind, host, process and a random part; a long host name is cut."""
    tail = f"-{os.getpid()}-{new_id()[:6]}"
    host = socket.gethostname().encode("ascii", "replace").decode()
    room = max(0, WORKER_ID_BYTES - len(kind) - 1 - len(tail))
    return f"{kind}-{host[:room]}{tail}"


class Liveness:
    """``async with`` one of the two backends below: ``worker_id`` is alive until ``lost``.

    ``interval``: how often the keeper looks at its connection and judges the others, at the
    most (more often when the grace is short); ``release``: what to hand back, in the same
    transaction, when it declares a worker dead (and when this worker retires); ``on_death``:
    told once that transaction committed (who may now take over the work: wake them);
    ``on_renew``: what to renew beside the row, each time; ``presence``: the broker, where the
    worker announces itself with a queue that disappears with its connection (module notes);
    ``worker_id``: chosen by the caller when the sessions it opened before are named after it.
    """

    def __init__(
        self,
        kind: str,
        *,
        worker_id: str | None = None,
        lease_seconds: float = 30.0,
        grace: float = 1.0,
        interval: float = 0.5,
        release: Release | None = None,
        on_death: Callable[[list[str]], None] | None = None,
        on_renew: Renew | None = None,
        presence: Transport | None = None,
    ) -> None:
        self.kind = kind
        self.worker_id = worker_id or new_worker_id(kind)
        self.lease_seconds = lease_seconds
        self.grace = grace
        self.interval = interval
        self._release = release
        self._on_death = on_death
        self._on_renew = on_renew
        self._presence = presence
        self._nudged = asyncio.Event()  # the liveness connection closed: look at once
        self.lost = asyncio.Event()  # set once this worker is presumed dead: stop working
        self._keeper: asyncio.Task[None] | None = None
        self._up_since: float | None = None  # when the liveness was last (re)taken
        self._renewed = 0.0
        self._pruned = 0.0

    # ---- what a backend provides --------------------------------------------------------

    held_sql: str  # "this worker row's lock is held", in the judgement's statements
    gone_sql: str  # "this worker is one of the list $3", in the judgement's statements
    death_level = logging.WARNING  # a death is news where processes fail one by one

    async def _register(self) -> None:
        raise NotImplementedError

    async def _ensure(self) -> bool:
        """Make sure the liveness session is up (reconnect and take the lock again if it was
        lost); True when it was (re)taken just now."""
        raise NotImplementedError

    def _transaction(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """A transaction on the liveness session; yields its connection."""
        raise NotImplementedError

    async def _close(self, *, broken: bool = False) -> None:
        raise NotImplementedError

    async def _end_sessions(self, conn: Any, dead: list[str]) -> int:
        """End the database sessions of workers just recorded dead, in the judgement's
        transaction; how many. Nothing to end where one process holds the database (SQLite)."""
        return 0

    # ---- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> Liveness:
        await self._register()
        if self._presence is not None:
            await self._presence.announce_presence(self._presence.topology.presence(self.worker_id))
        self._up_since = self._renewed = time.monotonic()
        self._keeper = asyncio.create_task(self._keeper_loop().run(), name=f"liveness-{self.kind}")
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._keeper
        try:
            if not self.lost.is_set():
                await self._retire()
        except Exception as exc:  # noqa: BLE001 - then the others presume it dead after the grace
            log.warning("retire_failed", worker=self.worker_id, error=repr(exc))
        finally:
            await self._close()

    async def _retire(self) -> None:
        """A clean stop: dead now, and its work handed back, so nobody waits for a lease."""
        await self._ensure()
        async with self._transaction() as conn:
            if await conn.fetchval(_RETIRE, self.worker_id) is not None and self._release is not None:
                await self._release(conn, [self.worker_id], False)

    # ---- the keeper ---------------------------------------------------------------------

    @property
    def up(self) -> bool:
        """Whether this worker's liveness holds now: its session up and its lease renewed since
        (False while the database is lost, and for good once the others presumed it dead)."""
        return self._up_since is not None and not self.lost.is_set()

    @property
    def settled(self) -> bool:
        """Whether this process has been continuously alive long enough (the grace, at most
        ``SETTLE_AT_MOST``) to presume others dead: they may be reconnecting, as it just did."""
        settle = min(self.grace, SETTLE_AT_MOST)
        return self._up_since is not None and time.monotonic() - self._up_since >= settle

    @property
    def _tick(self) -> float:
        return max(0.02, min(self.interval, self.grace / 4, self.lease_seconds / 6))

    def _keeper_loop(self) -> BackgroundLoop:
        """The keeper: a turn every tick, at once when the liveness connection closed, and with a
        short backoff while the database is away; it ends once this worker is presumed dead."""
        # A statement that hangs (a half-open connection) must not stop the renewals for good.
        patience = max(1.0, self.lease_seconds / 3)

        async def turn() -> None:
            try:
                async with asyncio.timeout(patience):
                    await self.step()
            except Exception:
                # Whatever it was, a new session starts clean. A restart shows up as many kinds of
                # errors (refused, shut down, a connection left mid-operation by a timeout):
                # weather, which the loop says at warning level, in one line.
                await self._close(broken=True)
                self._up_since = None
                raise

        return BackgroundLoop(
            f"liveness-{self.kind}", turn, period=self._tick, first=self._tick,
            backoff=Backoff(first=0.05, most=RECONNECT_MAX_DELAY), wake=self._nudged,
            until=self.lost.is_set, context={"worker": self.worker_id},
        )  # fmt: skip

    async def step(self) -> None:
        """One turn of the keeper: reconnect if needed, renew when due, judge when due."""
        now = time.monotonic()
        if await self._ensure():
            self._up_since = None  # not settled again before a whole grace has passed
        if self._up_since is None or now - self._renewed >= self.lease_seconds / 3:
            if not await self.renew():
                return
            if self._up_since is None:
                self._up_since = now
                log.info("liveness_restored", worker=self.worker_id)
        if self.settled:  # every tick: a death is seen within a tick of the broker seeing it
            await self.judge()

    async def confirm(self) -> None:
        """Return once this worker is known to hold its lease now (renewed within two thirds of
        a lease: no one can have taken its work over); raise StaleOwnerError once it is known to
        have lost it. After a freeze (a pause, SIGSTOP) this waits for the keeper's next look,
        so that work resumed by a process the others presumed dead stops here."""
        while not self.lost.is_set():
            if self._renewed and time.monotonic() - self._renewed < self.lease_seconds * 2 / 3:
                return
            await asyncio.sleep(min(0.05, self.lease_seconds / 30))
        raise StaleOwnerError(f"worker {self.worker_id} was presumed dead: its work was handed over")

    async def renew(self) -> bool:
        """Extend the lease (and what ``on_renew`` renews); False, with ``lost`` set, when this
        worker turned out to be presumed dead already."""
        async with self._transaction() as conn:
            if await conn.fetchval(_RENEW, self.worker_id, self.lease_seconds) is None:
                log.error(
                    "liveness_lost",
                    worker=self.worker_id,
                    reason="presumed dead by the others (no renewal within the lease, or a lost "
                    "connection not taken again within the grace): its work was handed over",
                )
                self.lost.set()
                return False
            if self._on_renew is not None:
                await self._on_renew(conn, self.worker_id)
        self._renewed = time.monotonic()
        return True

    async def judge(self) -> list[str]:
        """Record the death of workers whose lease ran out, or whose lock is gone for ``grace``
        or together with their presence on the broker; hand their work back in the same
        transaction. Returns their ids."""
        mark, suspects_sql, dead_sql = _judge_sql(self.held_sql, self.gone_sql)

        async def record(conn: Connection, gone: list[str]) -> list[str]:
            dead = [r["id"] for r in await conn.fetch(dead_sql, self.worker_id, self.grace, gone)]
            if dead:
                # Before the release: it waits for the rows a dead worker's session still locks
                # (a process frozen mid-statement holds them, and no timeout ends its session).
                ended = await self._end_sessions(conn, dead)
                if ended:
                    log.info("dead_workers_sessions_ended", workers=dead, sessions=ended)
            if dead and self._release is not None:
                await self._release(conn, dead, True)
            if time.monotonic() - self._pruned > PRUNE_EVERY:
                self._pruned = time.monotonic()
                await conn.execute(_PRUNE, PRUNE_AFTER)
            return dead

        async with self._transaction() as conn:
            await conn.execute(mark, self.worker_id)
            suspects = [r["id"] for r in await conn.fetch(suspects_sql, self.worker_id)]
            if not suspects or self._presence is None:  # the usual pass: one transaction
                dead = await record(conn, [])
        if suspects and self._presence is not None:
            gone = [w for w in suspects if await self._gone(w)]  # no transaction across broker calls
            async with self._transaction() as conn:
                dead = await record(conn, gone)
        if dead:
            log.log(self.death_level, "workers_presumed_dead", workers=dead)
            if self._on_death is not None:
                self._on_death(dead)
        return dead

    async def _gone(self, worker_id: str) -> bool:
        """Whether the broker no longer sees ``worker_id``'s process (its presence queue went
        with its connection); False when it cannot tell (then the grace decides)."""
        if self._presence is None:
            return False
        try:
            return not await self._presence.present(self._presence.topology.presence(worker_id))
        except Exception as exc:  # noqa: BLE001 - only a faster witness
            log.warning("presence_unknown", worker=worker_id, error=repr(exc))
            return False
