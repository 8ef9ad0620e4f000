"""A PostgreSQL that refuses another session for now ("too many connections", SQLSTATE 53300)
is a passing fault like a restart: a transaction that could not begin is tried again and goes
on once a session is free, and what cannot wait (an API request) gets a 503 in one line, not an
internal error. Against the real server, with a role whose connection limit is reached (a
superuser is exempt from such limits, so the test makes a role of its own). And a session that a
stopped process left inside a transaction is ended by the server, its locks with it."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest

from brain.api import Api, Tokens, create_app
from brain.rules.agents import AgentDefinition
from brain.rules.submits import Submit
from brain.store import open_brain_store, open_store
from infra.db import create_pool, session_settings, transact
from infra.process.settings import Settings
from infra.transport import Topology
from protocol import TransientError
from tests.support import TendonEnv

LIMIT = 3  # sessions the role may hold at once
AGENT = {"name": "a", "version": "1", "model": {"kind": "scripted", "script": [{"content": "hi"}]}}


@dataclass
class Limited:
    url: str  # the role's DSN
    schema: str


def as_role(url: str, role: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    return urlunsplit(parts._replace(netloc=f"{role}@{host}:{parts.port or 5432}"))


@pytest.fixture
async def limited(pg_url: str) -> AsyncIterator[Limited]:
    suffix = uuid.uuid4().hex[:8]
    role, schema = f"tendon_limited_{suffix}", f"tl_{suffix}"
    admin = await asyncpg.connect(pg_url)
    try:
        database = await admin.fetchval("SELECT current_database()")
        await admin.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT {LIMIT}")
        await admin.execute(f'GRANT CONNECT, CREATE ON DATABASE "{database}" TO {role}')
        await admin.execute(f"CREATE SCHEMA {schema} AUTHORIZATION {role}")
        yield Limited(as_role(pg_url, role), schema)
    finally:
        # The role's sessions end first: a role that still has one cannot be dropped.
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.execute(f"DROP OWNED BY {role}")
        await admin.execute(f"DROP ROLE {role}")
        await admin.close()


@contextlib.asynccontextmanager
async def every_other_session(url: str, pool: asyncpg.Pool) -> AsyncIterator[list[asyncpg.Connection]]:
    """Hold the pool's connection and all the sessions the role has left, so that the pool's
    next connection is refused; yields the held sessions (close one to free a slot)."""
    busy = await pool.acquire()
    held = [await asyncpg.connect(url) for _ in range(LIMIT - 1)]
    with pytest.raises(asyncpg.TooManyConnectionsError):
        await asyncpg.connect(url)  # the premise: the server takes no more of this role's sessions
    try:
        yield held
    finally:
        for conn in held:
            if not conn.is_closed():
                await conn.close()
        await pool.release(busy)


async def test_a_transaction_waits_for_a_session_the_server_refused_for_now(limited: Limited) -> None:
    pool = await create_pool(limited.url, limited.schema, max_size=LIMIT)
    try:
        async with every_other_session(limited.url, pool) as held:
            # Refused throughout its tries: a TransientError naming why, not asyncpg's own error.
            with pytest.raises(TransientError, match="too many connections"):
                await transact(pool, lambda conn: conn.fetchval("SELECT 1"))

            # A session freed while it waits: it goes on.
            async def free_one() -> None:
                await asyncio.sleep(0.15)
                await held.pop().close()

            freeing = asyncio.create_task(free_one())
            assert await transact(pool, lambda conn: conn.fetchval("SELECT 41 + 1")) == 42
            await freeing
    finally:
        await pool.close()


async def test_the_api_answers_503_while_the_database_refuses_and_serves_once_it_takes_sessions(
    limited: Limited,
) -> None:
    pool = await create_pool(limited.url, limited.schema, max_size=LIMIT)
    store = await open_brain_store(pool, limited.schema)
    api = Api(
        store=store, tokens=Tokens("", "", "default"), topology=Topology("t-refusals"), wake_channel="w"
    )
    transport = httpx.ASGITransport(app=create_app(api), raise_app_exceptions=False)
    body = {"request_id": "r-1", "input": "hello", "agent": AGENT}
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://brain") as http:
            async with every_other_session(limited.url, pool):
                submitted = await http.post("/v1/sessions/s-1/turns", json=body)
                assert submitted.status_code == 503, submitted.text
                error = submitted.json()["error"]
                assert error["code"] == "transient" and "too many connections" in error["message"]
                assert "\n" not in error["message"]
                read = await http.get("/v1/turns/turn-none")  # a read, not a transaction
                assert read.status_code == 503 and read.json()["error"]["code"] == "transient"
            # The client tries again once the database takes sessions: the turn is there, once.
            submitted = await http.post("/v1/sessions/s-1/turns", json=body)
            assert submitted.status_code == 201, submitted.text
            again = await http.post("/v1/sessions/s-1/turns", json=body)
            assert again.json()["turn_id"] == submitted.json()["turn_id"]
            found = await http.get(f"/v1/turns/{submitted.json()['turn_id']}")
            assert found.status_code == 200 and found.json()["status"] == "queued"
    finally:
        await pool.close()


async def test_a_brain_that_drives_many_turns_keeps_to_its_pool_size(limited: Limited, pg_url: str) -> None:
    """Its runs take a connection per transaction, not per turn: TENDON_CONCURRENCY does not
    size the pool (128 turns at once once asked for 134 sessions, more than a default server's
    100), TENDON_DB_POOL_SIZE does."""
    settings = Settings(
        database_url=limited.url, brain_schema=limited.schema, concurrency=128, db_pool_size=2
    )
    store = await open_store(settings)
    try:
        agent = AgentDefinition.model_validate(AGENT)
        burst = [
            store.submits.submit(Submit("default", f"s-{i}", f"r-{i}", "hello", agent, "w"))
            for i in range(40)
        ]
        assert len(set(await asyncio.gather(*burst))) == 40
        admin = await asyncpg.connect(pg_url)
        try:
            role = urlsplit(limited.url).username
            sessions = await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE usename = $1", role)
        finally:
            await admin.close()
        assert sessions <= 2 and store.pool.get_max_size() == 2
    finally:
        await store.close()


async def test_a_transaction_left_idle_by_a_stopped_process_loses_its_locks(tendon: TendonEnv) -> None:
    """A process stopped (SIGSTOP) between two statements of a transaction would hold that
    transaction's row locks until it wakes: the others could neither declare it dead nor take its
    work over (invariant 10). The server ends such a session after ``idle_in_transaction``."""
    schema = f"idle_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(tendon.database_url)
    await admin.execute(f'CREATE SCHEMA "{schema}"; CREATE TABLE "{schema}".rows (id int PRIMARY KEY, n int)')
    await admin.execute(f'INSERT INTO "{schema}".rows VALUES (1, 0)')
    stopped = await asyncpg.connect(tendon.database_url, server_settings=session_settings(schema, 0.5))
    ended = asyncio.Event()
    stopped.add_termination_listener(lambda _: ended.set())
    try:
        await stopped.execute("BEGIN; UPDATE rows SET n = 1 WHERE id = 1")  # and then nothing more
        # Another process's write of the same row waits only until the session is ended
        loop = asyncio.get_running_loop()
        started = loop.time()
        await admin.execute(f'UPDATE "{schema}".rows SET n = 2 WHERE id = 1', timeout=8)
        assert loop.time() - started < 5
        assert await admin.fetchval(f'SELECT n FROM "{schema}".rows WHERE id = 1') == 2
        # and the stopped one, when it wakes, finds its session gone (a passing fault)
        await asyncio.wait_for(ended.wait(), 5)
        assert stopped.is_closed()
        # Every pool's sessions have that limit
        pool = await create_pool(tendon.database_url, schema, max_size=1)
        async with pool.acquire() as conn:
            assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "10s"
        await pool.close()
    finally:
        stopped.terminate()
        await admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await admin.close()
