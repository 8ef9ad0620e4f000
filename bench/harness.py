"""Shared machinery: services, child processes (ended by PID), Tendon worlds and statistics.

Every wait is bounded; every process the harness starts is recorded and ended by its PID.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get("BENCH_DATABASE_URL", "postgresql://root@127.0.0.1:5432/test")
AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")


# --------------------------------------------------------------------------- statistics


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def wait_for(
    predicate: Callable[[], Awaitable[Any]], *, timeout: float, interval: float = 0.05, what: str
) -> Any:
    """Poll ``predicate`` until truthy; raise ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def gate_starts(path: Path) -> list[tuple[int, float]]:
    """(pid, wall-clock time) of every start of a gated tool body, in order (one line each)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            out.append((int(parts[0]), float(parts[1])))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- processes


class Processes:
    """Child processes of one benchmark run; each is ended by its own PID. ``tree``: the work
    tree whose code they run (this one by default; ``bench.ab`` compares two)."""

    def __init__(self, log_dir: Path, tree: Path = REPO) -> None:
        self.log_dir = log_dir
        self.tree = tree
        log_dir.mkdir(parents=True, exist_ok=True)
        self.children: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log_path = self.log_dir / f"{name}-{len(self.children)}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                args,
                cwd=self.tree,  # ``python -m`` imports the tree it runs in first
                env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        proc.log_path = log_path  # type: ignore[attr-defined]
        self.children.append(proc)
        return proc

    async def start_ready(
        self, name: str, args: list[str], env: dict[str, str], timeout: float = 30.0
    ) -> subprocess.Popen[bytes]:
        """Start a Tendon server (``python -m ...``) and wait for its ready file."""
        ready = self.log_dir / f"{name}-{uuid.uuid4().hex[:8]}.ready"
        proc = self.start(name, [sys.executable, *args], {**env, "TENDON_READY_FILE": str(ready)})

        async def is_ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}: {self.tail(proc)}")
            return ready.exists()

        await wait_for(is_ready, timeout=timeout, what=f"{name} ready")
        return proc

    @staticmethod
    def tail(proc: subprocess.Popen[bytes], n: int = 3000) -> str:
        return Path(proc.log_path).read_text(errors="replace")[-n:]  # type: ignore[attr-defined]

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; by PID only."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def stop_all(self) -> None:
        for proc in reversed(self.children):
            self.stop(proc)


# --------------------------------------------------------------------------- services


@dataclass
class Services:
    """Where PostgreSQL, RabbitMQ and S3 are for this run.

    The run gets its own database (``bench_<suffix>``), so ``pg_stat_database`` counts only
    what this run does, even while other work uses the server.
    """

    admin_url: str = PG_ADMIN_URL
    amqp_url: str = AMQP_URL
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    s3_env: dict[str, str] = field(default_factory=dict)
    # How the harness submits turns: "api", to the first Brain's HTTP API (a served submit, the
    # way a deployed client does), or "sql", into the database (as `brain submit` without --url).
    submit_over: str = "api"

    @property
    def dbname(self) -> str:
        return f"bench_{self.suffix}"

    @property
    def database_url(self) -> str:
        base = self.admin_url.rsplit("/", 1)[0]
        return f"{base}/{self.dbname}"

    async def create_database(self) -> None:
        conn = await asyncpg.connect(self.admin_url)
        try:
            await conn.execute(f'CREATE DATABASE "{self.dbname}"')
        finally:
            await conn.close()

    async def drop_database(self) -> None:
        conn = await asyncpg.connect(self.admin_url)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')
        finally:
            await conn.close()

    async def deadlocks(self) -> int:
        """``pg_stat_database.deadlocks`` of this run's database (flushed within a second or so)."""
        conn = await asyncpg.connect(self.admin_url)
        try:
            value = await conn.fetchval(
                "SELECT deadlocks FROM pg_stat_database WHERE datname = $1", self.dbname
            )
            return int(value or 0)
        finally:
            await conn.close()

    async def xact_commits(self) -> int:
        """``pg_stat_database.xact_commit`` of this run's database (this read commits too)."""
        conn = await asyncpg.connect(self.admin_url)
        try:
            return int(
                await conn.fetchval(
                    "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", self.dbname
                )
            )
        finally:
            await conn.close()

    def start_s3(self, procs: Processes) -> subprocess.Popen[bytes]:
        """A moto S3 server on a loopback port, as a child process."""
        port = free_port()
        args = [
            sys.executable,
            "-c",
            "from moto.server import main; main()",
            "-H",
            "127.0.0.1",
            "-p",
            str(port),
        ]
        proc = procs.start("moto", args, {})
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)
        self.s3_env = {
            "TENDON_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "TENDON_S3_BUCKET": "tendon-bench",
            "TENDON_S3_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        return proc


# --------------------------------------------------------------------------- Tendon


def agent(name: str, steps: list[list[dict[str, Any]]], tools: list[str]) -> dict[str, Any]:
    """A scripted agent definition: one model reply per step of tool calls, then 'done'."""
    script: list[dict[str, Any]] = [{"tool_calls": calls} for calls in steps]
    script.append({"content": "done"})
    version = hashlib.sha256(json.dumps(script, sort_keys=True).encode()).hexdigest()[:12]
    return {
        "name": name,
        "version": version,  # scripts differ by arguments: each gets its own version
        "model": {"kind": "scripted", "script": script},
        "tools": tools,
        "limits": {"max_model_calls": len(script) + 2},
    }


BRAIN = ["-m", "brain", "serve"]
HANDS = ["-m", "hands", "serve", "--route", "bench", "--tools", "bench.tools"]


# Where ``TendonWorld.stretches`` cuts a turn's span (submit to result applied), and ``rest``.
STRETCHES = ("submit", "reply", "accept", "outcome", "rest")


class TendonWorld:
    """One isolated Tendon deployment: its own schemas and queue prefix, real processes."""

    def __init__(self, services: Services, procs: Processes, extra: dict[str, str] | None = None) -> None:
        self.services = services
        self.procs = procs
        self.suffix = uuid.uuid4().hex[:8]
        self.extra = extra or {}
        self.pool: asyncpg.Pool | None = None
        self.store: Any = None
        self._agents: dict[str, Any] = {}
        self._tools: Any = None  # brain.verbs.KnownTools, kept as a Brain's API keeps it: no read per submit
        self.settings: Any = None
        self.gate_dir = procs.log_dir / f"gates-{self.suffix}"
        self.gate_dir.mkdir(parents=True, exist_ok=True)
        self._n = 0
        self.started: list[subprocess.Popen[bytes]] = []  # stopped by cleanup, before the queues go
        self.kinds: dict[str, list[subprocess.Popen[bytes]]] = {}  # "Brain"/"Hands" -> processes
        self.client: Any = None  # the first Brain's API client, when turns are submitted there
        self.api_brain: subprocess.Popen[bytes] | None = None  # that Brain (a killed one serves none)

    @property
    def brain_schema(self) -> str:
        return f"tb_{self.suffix}"

    @property
    def hands_schema(self) -> str:
        return f"th_{self.suffix}"

    @property
    def env(self) -> dict[str, str]:
        return {
            "TENDON_DATABASE_URL": self.services.database_url,
            "TENDON_BRAIN_SCHEMA": self.brain_schema,
            "TENDON_HANDS_SCHEMA": self.hands_schema,
            "TENDON_AMQP_URL": self.services.amqp_url,
            "TENDON_QUEUE_PREFIX": f"t-{self.suffix}",
            "TENDON_LOG_FORMAT": "json",
            "TENDON_LOG_LEVEL": "WARNING",
            "TENDON_HTTP": "off",
            "BENCH_GATE_DIR": str(self.gate_dir),
            **self.services.s3_env,
            **self.extra,
        }

    async def start_brain(self, **extra: str) -> subprocess.Popen[bytes]:
        if self.services.submit_over != "api" or self.client is not None:
            return await self.start_process("brain", BRAIN, extra)
        from brain.face.client import AsyncClient

        port = free_port()
        proc = await self.start_process("brain", BRAIN, {"TENDON_HTTP": f"127.0.0.1:{port}", **extra})
        self.client, self.api_brain = AsyncClient(f"http://127.0.0.1:{port}"), proc
        return proc

    async def start_hands(self, **extra: str) -> subprocess.Popen[bytes]:
        return await self.start_process("hands", HANDS, extra)

    async def start_process(
        self, name: str, args: list[str], extra: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        proc = await self.procs.start_ready(name, args, {**self.env, **extra})
        self.started.append(proc)
        self.kinds.setdefault(name.capitalize(), []).append(proc)
        return proc

    def roles(self) -> dict[str, list[int]]:
        """PIDs of this world's live processes by kind (for ``bench.cpu.CpuMeter``)."""
        return {kind: [p.pid for p in procs if p.poll() is None] for kind, procs in self.kinds.items()}

    async def open(self) -> None:
        """Open the submitting pool in this process (migrates the Brain schema if needed)."""
        from brain.store import open_store
        from infra.process.settings import Settings

        self.settings = Settings.model_validate(
            {
                k.removeprefix("TENDON_").lower(): v
                for k, v in self.env.items()
                if k.startswith("TENDON_") and k != "TENDON_LOG_LEVEL"
            }
        )
        self.store = await open_store(self.settings)
        self.pool = self.store.pool

    async def submit(self, definition: dict[str, Any], text: str = "go", session: str | None = None) -> str:
        """Submit one turn the way `brain submit` does (in a session of its own, or in
        ``session``: a later turn of a conversation); returns the turn id."""
        from brain import verbs
        from brain.rules.agents import AgentDefinition
        from brain.store import wake_channel

        assert self.store is not None
        key = json.dumps(definition, sort_keys=True)
        agent_def = self._agents.get(key)
        if agent_def is None:  # validated once, as a client that submits many turns would
            agent_def = self._agents[key] = AgentDefinition.model_validate(definition)
        if self._tools is None:
            self._tools = verbs.KnownTools()
        self._n += 1
        if self.client is not None and self.api_brain is not None and self.api_brain.poll() is None:
            return await self.client.submit(session or f"s-{self._n}", f"r-{self._n}", text, definition)
        turn_id, _ = await verbs.submit(
            self.store,
            namespace=self.settings.namespace,
            session_id=session or f"s-{self._n}",
            request_id=f"r-{self._n}",
            user_input=text,
            agent=agent_def,
            wake_channel=wake_channel(self.settings),
            tools=self._tools,
        )
        return str(turn_id)

    async def call(self, definition: dict[str, Any], timeout: float) -> str:
        """Submit one turn and wait until it completed, the way a client that wants the answer
        does: through the API, one request (``POST ...turns?wait=``, answered when the turn's end
        commits), else as :meth:`submit` and :meth:`wait_turn`; a turn not completed raises.
        Returns the turn id."""
        if self.client is None or self.api_brain is None or self.api_brain.poll() is not None:
            turn_id = await self.submit(definition)
            await self.wait_turn(turn_id, timeout=timeout)
            return turn_id
        self._n += 1
        found = await self.client.call(f"s-{self._n}", f"r-{self._n}", "go", definition, within=timeout)
        if found["status"] != "completed":
            raise RuntimeError(f"turn {found['turn_id']} is {found['status']} after {timeout:g} s")
        return str(found["turn_id"])

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        assert self.pool is not None
        async with self.pool.acquire() as conn:
            return await conn.fetch(sql, *args)

    async def statuses(self, ids: list[str]) -> dict[str, str]:
        assert self.store is not None
        return await self.store.turns.statuses(ids)

    async def wait_done(self, ids: list[str], timeout: float, interval: float = 0.005) -> None:
        """Wait until every turn is completed; a failed turn raises."""
        pending = set(ids)

        async def done() -> bool:
            for tid, status in (await self.statuses(list(pending))).items():
                if status == "completed":
                    pending.discard(tid)
                elif status in ("failed", "cancelled"):
                    raise RuntimeError(f"turn {tid} ended {status}")
            return not pending

        await wait_for(done, timeout=timeout, interval=interval, what=f"{len(pending)} turns")

    async def wait_turn(self, turn_id: str, timeout: float) -> None:
        """Wait until one turn is completed the way a client of the API does (``GET
        /v1/turns/{id}?wait=``, answered when the turn's end commits), else by looking every
        2 ms; a failed turn raises."""
        if self.client is None or self.api_brain is None or self.api_brain.poll() is not None:
            await self.wait_done([turn_id], timeout=timeout, interval=0.002)
            return
        found = await self.client.turn(turn_id, wait=timeout)
        if found["status"] != "completed":
            raise RuntimeError(f"turn {turn_id} is {found['status']} after {timeout:g} s")

    async def server_latencies(self, ids: list[str]) -> list[float]:
        """Seconds from the submit commit's timestamp to the completing commit's timestamp."""
        rows = await self.fetch(
            "SELECT extract(epoch FROM updated_at - created_at)::float8 AS s FROM turns"
            " WHERE id = ANY($1::text[]) AND status = 'completed'",
            ids,
        )
        return [float(r["s"]) for r in rows]

    async def result_applied_latencies(self, ids: list[str]) -> list[float]:
        """Seconds from the submit commit to the commit that applied the (first) tool result.

        This is the issue's "submit to result applied": it stops where the floor stops (the
        Brain's result commit), before the second model step and the finalize.
        """
        rows = await self.fetch(
            "SELECT extract(epoch FROM min(e.updated_at) - t.created_at)::float8 AS s"
            " FROM turns t JOIN executions e ON e.turn_id = t.id"
            " WHERE t.id = ANY($1::text[]) AND e.status = 'succeeded' GROUP BY t.id, t.created_at",
            ids,
        )
        return [float(r["s"]) for r in rows]

    async def stretches(self, ids: list[str]) -> dict[str, list[float]]:
        """The span cut at each commit on it, seconds, one value per turn and stretch.

        Each stamp is its transaction's ``now()`` (its start): the submit (the turn's row), the
        reply with its intent (the Brain's execution row), the Hands' accept (their ledger row),
        their last change, the outcome (the ledger row's ``updated_at``), and the apply (the
        Brain's execution row's ``updated_at``). A stretch is the statement that opens it, its
        commit, and what runs until the next transaction starts. ``rest`` is the span less the
        submit's stretch: from the reply, the floor's span's counterpart, to the apply. For turns
        of one tool call (a turn with more has a row per call).
        """
        rows = await self.fetch(
            "SELECT extract(epoch FROM b.created_at - t.created_at)::float8 AS submit,"
            " extract(epoch FROM h.created_at - b.created_at)::float8 AS reply,"
            " extract(epoch FROM h.updated_at - h.created_at)::float8 AS accept,"
            " extract(epoch FROM b.updated_at - h.updated_at)::float8 AS outcome,"
            " extract(epoch FROM b.updated_at - b.created_at)::float8 AS rest"
            " FROM turns t JOIN executions b ON b.turn_id = t.id"
            f' JOIN "{self.hands_schema}".executions h ON h.execution_id = b.id'
            " WHERE t.id = ANY($1::text[]) AND b.status = 'succeeded'",
            ids,
        )
        return {key: [float(r[key]) for r in rows] for key in STRETCHES}

    async def settle(self) -> None:
        """Analyze this world's tables after a warm-up (see :func:`settle`)."""
        await settle(self.services.database_url, [self.brain_schema, self.hands_schema])

    def gate(self, name: str) -> Path:
        return self.gate_dir / name

    async def cleanup(self) -> None:
        """Stop the world's processes, close the pool, drop both schemas, delete the queues.

        The processes go first: a live Brain or Hands re-declares a deleted queue. Each step
        runs even when an earlier one failed (the first error is raised at the end).
        """
        for proc in reversed(self.started):
            self.procs.stop(proc)
        errors: list[BaseException] = []
        if self.client is not None:
            await self.client.close()
            self.client = None
        try:
            if self.pool is not None:
                await self.pool.close()
                self.pool = None
            conn = await asyncpg.connect(self.services.database_url)
            try:
                for schema in (self.brain_schema, self.hands_schema):
                    await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await conn.close()
        except Exception as exc:  # noqa: BLE001 - the queues are deleted all the same
            errors.append(exc)
        prefix = f"t-{self.suffix}"
        names = [
            f"{prefix}.updates",
            f"{prefix}.bindings",
            f"{prefix}.bench.commands",
            f"{prefix}.bench.controls",
        ]
        try:
            await delete_amqp(self.services.amqp_url, names + [f"{n}.dlq" for n in names], [f"{prefix}.dlx"])
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        if errors:
            raise errors[0]


async def settle(database_url: str, schemas: list[str]) -> None:
    """VACUUM ANALYZE every table of ``schemas``: measure steady state, not a new deployment.

    Tables start empty, and a plan PostgreSQL caches for a prepared statement while a table is
    nearly empty (sequential scans) stays in use on that connection until the table is
    analyzed again; the dead row versions of rows updated many times pile up until a vacuum.
    Autovacuum does both once a minute at most (``autovacuum_naptime``); the throughput levels
    last seconds, so each one starts from settled tables, for every side alike.
    """
    conn = await asyncpg.connect(database_url)
    try:
        tables = await conn.fetch(
            "SELECT schemaname, tablename FROM pg_tables WHERE schemaname = ANY($1::text[])", schemas
        )
        for t in tables:
            await conn.execute(f'VACUUM (ANALYZE) "{t["schemaname"]}"."{t["tablename"]}"')
    finally:
        await conn.close()


async def delete_amqp(amqp_url: str, queues: list[str], exchanges: list[str]) -> None:
    """Delete queues (quorum ones too: unused or not, empty or not) and exchanges; bounded."""

    async def go() -> None:
        connection = await aio_pika.connect(amqp_url)
        async with connection:
            for name in queues:
                channel = await connection.channel()
                await channel.queue_delete(name, if_unused=False, if_empty=False)
                await channel.close()
            for name in exchanges:
                channel = await connection.channel()
                await channel.exchange_delete(name)
                await channel.close()

    await asyncio.wait_for(go(), 60)


def one_call_agent(tool: str = "noop", calls: int = 1, **args: Any) -> dict[str, Any]:
    """An agent whose turn makes ``calls`` sequential calls of ``tool``."""
    steps = [[{"tool": tool, "args": {**args}}] for _ in range(calls)]
    return agent(f"bench-{tool}-{calls}", steps, [tool])


def parallel_agent(calls: int) -> dict[str, Any]:
    """An agent whose turn makes ``calls`` calls of ``noop`` in one model step."""
    steps = [[{"tool": "noop", "args": {"n": i}} for i in range(calls)]]
    return agent(f"bench-noop-x{calls}", steps, ["noop"])


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str)
