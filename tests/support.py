"""Test support: per-test isolated settings and real OS processes with bounded waits."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

from infra.db import session_name
from infra.liveness import Liveness
from infra.liveness.registrations import WorkerRegistration
from infra.process.settings import Settings

REPO = Path(__file__).resolve().parent.parent


# Every route a test of this suite serves or publishes to. A world's cleanup deletes the queues
# of all of them (deleting a queue that does not exist is a no-op), so a test that forgot to add
# its route to ``TendonEnv.routes`` still leaves nothing behind.
TEST_ROUTES = frozenset({"email", "lab", "other", "bulk", "conf", "hello", "gone"})

# Every world this process made, by suffix, and those whose cleanup has not finished (a
# failed or interrupted teardown): the session's last sweep (tests/conftest.py) goes over them.
WORLDS: dict[str, TendonEnv] = {}
UNCLEANED: dict[str, TendonEnv] = {}


@dataclass
class TendonEnv:
    """One test's private world: its own schemas, queue prefix and S3 scope."""

    database_url: str
    amqp_url: str
    extra: dict[str, str] = field(default_factory=dict)
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    routes: set[str] = field(default_factory=lambda: {"email"})

    def __post_init__(self) -> None:
        # Recorded before anything is created under these names.
        WORLDS[self.suffix] = self
        UNCLEANED[self.suffix] = self

    @property
    def prefix(self) -> str:
        return f"t-{self.suffix}"

    @property
    def schemas(self) -> tuple[str, str]:
        return f"tb_{self.suffix}", f"th_{self.suffix}"

    @property
    def env(self) -> dict[str, str]:
        return {
            "TENDON_DATABASE_URL": self.database_url,
            "TENDON_BRAIN_SCHEMA": f"tb_{self.suffix}",
            "TENDON_HANDS_SCHEMA": f"th_{self.suffix}",
            "TENDON_AMQP_URL": self.amqp_url,
            "TENDON_QUEUE_PREFIX": self.prefix,
            "TENDON_LOG_FORMAT": "json",
            "TENDON_SCAN_INTERVAL": "0.2",
            "TENDON_GAP_TIMEOUT": "0.5",
            "TENDON_LEASE_SECONDS": "10",
            "TENDON_RECONNECT_GRACE": "1",
            "TENDON_HTTP": "off",  # many Brains run at once here: the API tests give theirs an address
            **self.extra,
        }

    def settings(self, **overrides: Any) -> Settings:
        values = {
            k.removeprefix("TENDON_").lower(): v for k, v in self.env.items() if k.startswith("TENDON_")
        }
        values.update(overrides)
        return Settings(**values)

    def queue_names(self) -> list[str]:
        """Every queue this world may have: per route, and each one's dead-letter queue."""
        prefix = self.prefix
        names = [f"{prefix}.updates", f"{prefix}.bindings"]
        for route in sorted(self.routes | TEST_ROUTES):
            names += [f"{prefix}.{route}.commands", f"{prefix}.{route}.controls"]
        return names + [f"{n}.dlq" for n in names]

    async def cleanup(self) -> None:
        """Drop the schemas, delete the queues (and their dead-letter queues) and the exchange.

        Each part runs even when the other failed; the first error is raised at the end. The
        world stays in ``UNCLEANED`` until one cleanup got through, so that a teardown cut short
        (an error, or the test's timeout firing in the middle of it) is finished by the
        session's last sweep.
        """
        errors: list[Exception] = []
        for part in (self.drop_schemas, self.delete_broker_objects):
            try:
                async with asyncio.timeout(60):
                    await part()
            except Exception as exc:  # noqa: BLE001 - the other part runs all the same
                errors.append(exc)
        if errors:
            raise errors[0]
        UNCLEANED.pop(self.suffix, None)

    async def drop_schemas(self) -> None:
        # Bounded: a connection some test left open inside a transaction must not hang the
        # teardown (the schema then stays for the session's last sweep).
        conn = await asyncpg.connect(self.database_url, timeout=10, server_settings={"lock_timeout": "20s"})
        try:
            for schema in self.schemas:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    async def delete_broker_objects(self) -> None:
        await delete_queues_and_exchanges(self.amqp_url, self.queue_names(), [f"{self.prefix}.dlx"])


async def delete_queues_and_exchanges(amqp_url: str, queues: list[str], exchanges: list[str]) -> None:
    """Delete queues (quorum ones included) and exchanges, whether or not they exist.

    Quorum queues refuse ``if-unused`` deletes (see PITFALLS.md): deleted unconditionally.
    One failed delete does not stop the others; the first error is raised at the end.
    """
    errors: list[Exception] = []
    connection = await aio_pika.connect(amqp_url, timeout=10)
    async with connection:
        channel = await connection.channel()
        for kind, name in [("queue", n) for n in queues] + [("exchange", n) for n in exchanges]:
            try:
                if channel.is_closed:
                    channel = await connection.channel()
                if kind == "queue":
                    await channel.queue_delete(name, timeout=10, if_unused=False, if_empty=False)
                else:
                    await channel.exchange_delete(name, timeout=10, if_unused=False)
            except Exception as exc:  # noqa: BLE001 - go on with the next one
                errors.append(exc)
        if not channel.is_closed:
            await channel.close()
    if errors:
        raise errors[0]


def free_port() -> int:
    """A loopback TCP port nothing listens on (for a server a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_for(
    predicate: Callable[[], Awaitable[Any]],
    *,
    timeout: float = 30.0,
    interval: float = 0.1,
    what: str = "condition",
) -> Any:
    """Poll ``predicate`` until it returns something truthy, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


class TableScans:
    """How PostgreSQL counts the scans of one table of the connection's schema: sequential ones
    and by index. The counters are reported when a session goes idle, so each look makes this
    connection's own report go out first; another connection's may come a little later."""

    def __init__(self, conn: asyncpg.Connection, table: str) -> None:
        self.conn = conn
        self.table = table

    async def now(self) -> tuple[int, int]:
        await self.conn.execute("SELECT pg_stat_force_next_flush()")
        rec = await self.conn.fetchrow(
            "SELECT seq_scan, coalesce(idx_scan, 0) AS idx_scan FROM pg_stat_user_tables"
            " WHERE schemaname = current_schema() AND relname = $1",
            self.table,
        )
        return int(rec["seq_scan"]), int(rec["idx_scan"])

    async def since(self, before: tuple[int, int], timeout: float = 5.0) -> tuple[int, int]:
        """(sequential scans, index scans) since ``before``, once a scan was counted."""

        async def moved() -> tuple[int, int] | None:
            seq, idx = await self.now()
            return (seq - before[0], idx - before[1]) if (seq, idx) != before else None

        counted: tuple[int, int] = await wait_for(moved, timeout=timeout, what=f"a scan of {self.table}")
        return counted


def crash(registration: Liveness) -> None:
    """Stop a worker registration as SIGKILL would: no renewal, no retirement, its session
    gone (a test of liveness rules without a process to kill)."""
    assert registration._keeper is not None
    registration._keeper.cancel()
    registration.lost.set()  # so that leaving its ``async with`` retires nothing
    if isinstance(registration, WorkerRegistration) and registration._connection is not None:
        registration._connection.terminate()


def freeze(registration: Liveness) -> None:
    """Stop a worker registration as SIGSTOP would: no renewal, while its sessions live on."""
    assert registration._keeper is not None
    registration._keeper.cancel()


@asynccontextmanager
async def session_locking(
    dsn: str, schema: str, worker_id: str, statement: str, *args: Any
) -> AsyncIterator[asyncpg.Connection]:
    """A session named as ``worker_id``'s that runs ``statement`` (a row lock) in a transaction it
    leaves open, as a process frozen mid-statement does: such a session is not idle in
    transaction, so no timeout of the server's ends it (here: none is set)."""
    conn = await asyncpg.connect(
        dsn,
        server_settings={
            "search_path": schema,
            "application_name": session_name(worker_id),
            "idle_in_transaction_session_timeout": "0",
        },
    )
    try:
        await conn.execute("BEGIN")
        await conn.execute(statement, *args)
        yield conn
    finally:
        conn.terminate()


async def sessions_named(pool: Any, worker_id: str) -> int:
    """How many database sessions bear ``worker_id``'s name."""
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", session_name(worker_id)
        )
    )


class Processes:
    """Child processes of one test; every one is ended by its PID at teardown."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}-{len(self.children)}.log", "wb")  # noqa: SIM115
        full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(
            [sys.executable, *args], cwd=REPO, env=full_env, stdout=log, stderr=subprocess.STDOUT
        )
        proc.log_path = log.name  # type: ignore[attr-defined]
        log.close()
        self.children.append(proc)
        return proc

    async def start_ready(
        self, name: str, args: list[str], env: dict[str, str], *, timeout: float = 30.0
    ) -> subprocess.Popen[bytes]:
        """Start a Tendon server and wait until it wrote its ready file."""
        ready = self.log_dir / f"{name}-{len(self.children)}.ready"
        proc = self.start(name, args, {**env, "TENDON_READY_FILE": str(ready)})

        async def is_ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.output(proc)}")
            return ready.exists()

        await wait_for(is_ready, timeout=timeout, what=f"{name} to be ready")
        return proc

    @staticmethod
    def output(proc: subprocess.Popen[bytes]) -> str:
        return Path(proc.log_path).read_text(errors="replace")[-5000:]  # type: ignore[attr-defined]

    async def wait_exit(self, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
        async def exited() -> bool:
            return proc.poll() is not None

        await wait_for(exited, timeout=timeout, what=f"pid {proc.pid} to exit")
        return proc.returncode

    def stop_all(self) -> None:
        for proc in self.children:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.children:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def run_cli(args: list[str], env: dict[str, str], timeout: float = 60.0) -> tuple[int, str, str]:
    """Run a Tendon CLI verb as a real process; returns (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        cwd=REPO,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


# Every child row and the parent it must have: the database checks none of these (integrity by
# construction, brain migration 9), so the tests do, after real runs (``orphans``).
PARENTS: dict[str, list[tuple[str, str, str]]] = {
    "brain": [
        ("threads", "session_id", "sessions.id"),
        ("turns", "session_id", "sessions.id"),
        ("turns", "thread_id", "threads.id"),
        ("journal", "session_id", "sessions.id"),
        ("journal", "turn_id", "turns.id"),
        ("executions", "turn_id", "turns.id"),
        ("held_events", "execution_id", "executions.id"),
        ("execution_output", "execution_id", "executions.id"),
        ("batches", "id", "executions.id"),  # a batch is its call's execution
        ("batches", "turn_id", "turns.id"),
    ],
    "hands": [
        ("output_chunks", "execution_id", "executions.execution_id"),
        ("reconciliations", "execution_id", "executions.execution_id"),
    ],
}


def orphans_sql(component: str, schema: str = "") -> str:
    """One query counting, per relation of ``component``, the child rows without their parent."""
    at = f"{schema}." if schema else ""
    parts = []
    for child, column, parent in PARENTS[component]:
        table, key = parent.split(".")
        parts.append(
            f"SELECT '{child}.{column}' AS relation, count(*) AS n FROM {at}{child} c"
            f" WHERE NOT EXISTS (SELECT 1 FROM {at}{table} p WHERE p.{key} = c.{column})"
        )
    return " UNION ALL ".join(parts)


class Observer:
    """Reads the Brain's and the Hands' rows the way an operator would, for assertions."""

    def __init__(self, world: TendonEnv) -> None:
        self.world = world
        self.brain = f"tb_{world.suffix}"
        self.hands = f"th_{world.suffix}"

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(self.world.database_url)
        for typename in ("json", "jsonb"):
            await conn.set_type_codec(typename, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
        try:
            return await conn.fetch(sql.replace("{brain}", self.brain).replace("{hands}", self.hands), *args)
        finally:
            await conn.close()

    async def turn(self, turn_id: str) -> asyncpg.Record | None:
        rows = await self.fetch("SELECT * FROM {brain}.turns WHERE id = $1", turn_id)
        return rows[0] if rows else None

    async def turn_status(self, turn_id: str) -> str | None:
        row = await self.turn(turn_id)
        return None if row is None else row["status"]

    async def wait_turn(self, turn_id: str, status: str, timeout: float = 60.0) -> asyncpg.Record:
        async def reached() -> asyncpg.Record | None:
            row = await self.turn(turn_id)
            if row is not None and row["status"] in ("failed", "cancelled") and status != row["status"]:
                raise AssertionError(f"turn ended {row['status']}: {row['error']}")
            return row if row is not None and row["status"] == status else None

        return await wait_for(reached, timeout=timeout, what=f"turn {turn_id} to be {status}")

    async def executions(self, turn_id: str) -> list[asyncpg.Record]:
        return await self.fetch(
            "SELECT * FROM {brain}.executions WHERE turn_id = $1 ORDER BY tool_step, call_id",
            turn_id,
        )

    async def parked(self, queue: str, *, count: int = 1, component: str = "brain") -> list[asyncpg.Record]:
        """Wait until ``count`` messages of ``queue`` were parked and read back by ``component``
        (``brain`` or ``hands``: whose ``parked`` table); returns them in order."""

        async def recorded() -> list[asyncpg.Record] | None:
            rows = await self.fetch(
                f"SELECT * FROM {{{component}}}.parked WHERE queue = $1 ORDER BY id", queue
            )
            return rows if len(rows) >= count else None

        return await wait_for(recorded, timeout=30, what=f"{count} parked message(s) of {queue}")

    async def orphans(self) -> dict[str, int]:
        """Child rows without their parent, by relation, in both schemas (empty when none)."""
        found: dict[str, int] = {}
        for component, schema in (("brain", self.brain), ("hands", self.hands)):
            for r in await self.fetch(orphans_sql(component, schema)):
                if r["n"]:
                    found[f"{component} {r['relation']}"] = r["n"]
        return found

    async def hands_events(self, execution_id: str) -> list[dict[str, Any]]:
        """The status events the Hands ledger keeps for an execution (as they were published)."""
        rows = await self.fetch("SELECT events FROM {hands}.executions WHERE execution_id = $1", execution_id)
        return list(rows[0]["events"]) if rows else []

    async def facts(self, turn_id: str, kind: str | None = None) -> list[dict[str, Any]]:
        """The journal facts of a turn, in order (of one kind, with ``kind``)."""
        rows = await self.fetch("SELECT facts FROM {brain}.journal WHERE turn_id = $1 ORDER BY seq", turn_id)
        return [f for r in rows for f in r["facts"] if kind is None or f["kind"] == kind]

    async def ledger(self) -> list[asyncpg.Record]:
        return await self.fetch("SELECT * FROM {hands}.executions ORDER BY created_at")
