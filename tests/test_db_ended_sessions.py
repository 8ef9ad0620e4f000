"""A session that PostgreSQL ended (a shutdown or a restart under load, an administrator's
``pg_terminate_backend``) is a lost connection like any other: the API answers 503, a transaction
raises ``TransientError``, and the pool's next connection is a new one; so too for a session ended
in the middle of a transaction of a group committer, which keeps its connection between them.

asyncpg takes the server's last message ("terminating connection due to administrator command")
on an idle connection as the start of an answer, and until it sees the socket close it refuses
the next statement with an ``InternalClientError`` ("cannot switch to state 12; another operation
(2) is in progress"), which the API answered with a 500. Against the real server: a proxy in
front of it passes the server's last message on but holds back the close, which keeps the
connection in that window for as long as the test needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from brain.api import Api, Tokens, create_app
from brain.store import open_brain_store
from chaos.proxy import LoopbackProxy
from infra.db import create_pool, reading, transact
from infra.db.held import HeldConnection
from infra.transport import Topology
from protocol import TransientError

AGENT = {"name": "a", "version": "1", "model": {"kind": "scripted", "script": [{"content": "hi"}]}}


class LateClose(LoopbackProxy):
    """Forwards every byte both ways, but a close of the server's side reaches the client only
    when the proxy closes: the window between a session's end and its socket's close, held."""

    default_port = 5432

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.ended = asyncio.Event()  # a server side closed, everything it sent passed on
        self._clients: list[asyncio.StreamWriter] = []

    async def _connected(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self._target)
        self._clients.append(client_w)
        self._spawn(
            asyncio.create_task(self._pump(client_r, server_w, ends=server_w)),
            asyncio.create_task(self._pump(server_r, client_w, ends=None)),
        )

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ends: asyncio.StreamWriter | None
    ) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        if ends is None:  # the server's side: its last bytes are on their way, the close is not
            self.ended.set()
        else:
            ends.transport.abort()

    async def __aexit__(self, *exc: object) -> None:
        for writer in self._clients:
            writer.transport.abort()
        await super().__aexit__(*exc)


@contextlib.asynccontextmanager
async def through_proxy(pg_url: str) -> AsyncIterator[tuple[LateClose, asyncpg.Pool, str]]:
    """A pool of one connection through a ``LateClose`` proxy, in a schema of its own."""
    schema = f"tw_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(pg_url)
    await admin.execute(f"CREATE SCHEMA {schema}")
    try:
        async with LateClose(pg_url) as proxy:
            pool = await create_pool(proxy.url, schema, min_size=1, max_size=1)
            try:
                yield proxy, pool, schema
            finally:
                pool.terminate()
    finally:
        await admin.execute(f"DROP SCHEMA {schema} CASCADE")
        await admin.close()


async def end_sessions(pg_url: str, proxy: LateClose, schema: str) -> None:
    """End the pool's session on the server, as a shutdown does, and return once the server's
    last message has reached the client's socket."""
    proxy.ended.clear()
    admin = await asyncpg.connect(pg_url)
    try:
        ended = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
            f"tendon:{schema}",
        )
    finally:
        await admin.close()
    assert ended == 1
    await asyncio.wait_for(proxy.ended.wait(), 10)
    await asyncio.sleep(0.05)  # the bytes are in the socket: the next look of the loop reads them


async def test_a_read_on_a_session_the_server_ended_is_a_passing_fault_and_the_next_is_served(
    pg_url: str,
) -> None:
    async with through_proxy(pg_url) as (proxy, pool, schema):
        async with reading(pool) as conn:
            assert await conn.fetchval("SELECT 1") == 1
        await end_sessions(pg_url, proxy, schema)

        with pytest.raises(TransientError):
            async with reading(pool) as conn:
                await conn.fetchval("SELECT 1")

        # The connection was dropped, not handed out again: the next one is a new session.
        async with reading(pool) as conn:
            assert await conn.fetchval("SELECT 2") == 2


async def test_a_transaction_on_a_session_the_server_ended_raises_transient_and_the_next_commits(
    pg_url: str,
) -> None:
    async with through_proxy(pg_url) as (proxy, pool, schema):
        assert await transact(pool, lambda conn: conn.fetchval("SELECT 1")) == 1
        await end_sessions(pg_url, proxy, schema)

        with pytest.raises(TransientError, match="connection lost"):
            await transact(pool, lambda conn: conn.fetchval("SELECT 1"))
        assert await transact(pool, lambda conn: conn.fetchval("SELECT 3")) == 3


async def test_waiting_for_a_turn_on_a_session_the_server_ended_answers_503_then_the_turn(
    pg_url: str,
) -> None:
    async with through_proxy(pg_url) as (proxy, pool, schema):
        store = await open_brain_store(pool, schema)
        api = Api(store=store, tokens=Tokens("", "", "default"), topology=Topology("t-w"), wake_channel="w")
        transport = httpx.ASGITransport(app=create_app(api), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://brain") as http:
            submitted = await http.post(
                "/v1/sessions/s-1/turns", json={"request_id": "r", "input": "hi", "agent": AGENT}
            )
            assert submitted.status_code == 201, submitted.text
            turn_id = submitted.json()["turn_id"]
            await end_sessions(pg_url, proxy, schema)

            waited = await http.get(f"/v1/turns/{turn_id}", params={"wait": "1s"})

            assert waited.status_code == 503, waited.text
            assert waited.json()["error"]["code"] == "transient"
            again = await http.get(f"/v1/turns/{turn_id}", params={"wait": "0.2s"})
            assert again.status_code == 200 and again.json()["status"] == "queued", again.text


async def test_a_session_ended_in_the_middle_of_a_transaction_raises_transient_held_or_not(
    pg_url: str,
) -> None:
    schema = f"tw_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(pg_url)
    await admin.execute(f"CREATE SCHEMA {schema}")
    pool = await create_pool(pg_url, schema, max_size=2)
    held = HeldConnection(pool, idle=5.0)

    async def ended_by_itself(conn: asyncpg.Connection) -> int:
        # The server's answer: 57P01, "terminating connection due to administrator command"
        return int(await conn.fetchval("SELECT pg_terminate_backend(pg_backend_pid())::int"))

    async def ended_meanwhile(conn: asyncpg.Connection) -> int:
        await admin.execute("SELECT pg_terminate_backend($1)", await conn.fetchval("SELECT pg_backend_pid()"))
        await asyncio.sleep(0.3)  # its end reached the client: asyncpg handed the connection back itself
        return int(await conn.fetchval("SELECT 1"))

    try:
        for work in (ended_by_itself, ended_meanwhile):
            for keeper in (None, held):
                with pytest.raises(TransientError, match="connection lost"):
                    await transact(pool, work, held=keeper)
                assert await transact(pool, lambda conn: conn.fetchval("SELECT 4"), held=keeper) == 4
    finally:
        await held.close()
        await pool.close()
        await admin.execute(f"DROP SCHEMA {schema} CASCADE")
        await admin.close()
