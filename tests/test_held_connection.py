"""A connection a group committer keeps between its transactions (``infra.db.held.HeldConnection``),
on PostgreSQL: reused while in use, given back when idle, broken or left in a transaction, so a
closing pool never waits for it for long."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from infra.db import create_pool, transact
from infra.db.held import HeldConnection
from tests.support import TendonEnv


@pytest.fixture
async def pool(tendon: TendonEnv) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(tendon.database_url, tendon.settings().brain_schema, max_size=4)
    yield p
    await asyncio.wait_for(p.close(), 10)  # hangs (and fails) while a held connection stays out


async def _backend(conn: Any) -> int:
    return int(await conn.fetchval("SELECT pg_backend_pid()"))


async def test_transactions_through_a_held_connection_run_on_one_connection(pool: asyncpg.Pool) -> None:
    held = HeldConnection(pool, idle=5.0)
    # Given another user holding one of the pool's connections meanwhile
    async with pool.acquire() as other:
        pids = [await transact(pool, _backend, held=held) for _ in range(5)]
        assert await _backend(other) not in pids
    # Then every transaction ran on the same connection, which the pool does not count as free
    assert len(set(pids)) == 1
    assert pool.get_idle_size() == pool.get_size() - 1
    await held.close()
    assert pool.get_idle_size() == pool.get_size()


async def test_an_idle_held_connection_goes_back_so_a_pool_closes_promptly(tendon: TendonEnv) -> None:
    pool = await create_pool(tendon.database_url, tendon.settings().brain_schema, max_size=2)
    held = HeldConnection(pool, idle=0.2)
    await transact(pool, _backend, held=held)
    # When the pool closes right after (it waits for every connection it lent), nobody closing
    # the held connection
    started = time.monotonic()
    await asyncio.wait_for(pool.close(), 10)
    # Then the held one came back once idle, not never
    assert time.monotonic() - started < 2.0


async def test_a_broken_held_connection_is_replaced_and_one_in_a_transaction_is_not_kept(
    pool: asyncpg.Pool,
) -> None:
    held = HeldConnection(pool, idle=5.0)
    first = await transact(pool, _backend, held=held)
    # Given the held connection's session ended by the server (a restart, an administrator)
    async with pool.acquire() as admin:
        await admin.execute("SELECT pg_terminate_backend($1)", first)
    await asyncio.sleep(0.2)
    # Then the next transaction runs on a new connection
    second = await transact(pool, _backend, held=held)
    assert second != first

    # And a connection handed back inside a transaction is not kept for the next user
    conn = await held.acquire()
    tx = conn.transaction()
    await tx.start()
    await held.release(conn)
    assert await transact(pool, lambda c: c.fetchval("SELECT 1"), held=held) == 1
    conn = await held.acquire()
    assert not conn.is_in_transaction()
    await held.release(conn)
    await held.close()


async def test_two_users_at_once_leave_no_connection_behind(pool: asyncpg.Pool) -> None:
    held = HeldConnection(pool, idle=5.0)

    async def slow(conn: Any) -> int:
        await asyncio.sleep(0.05)
        return await _backend(conn)

    # When two transactions go through one held connection at the same moment
    first, second = await asyncio.gather(*(transact(pool, slow, held=held) for _ in range(2)))
    # Then each had a connection of its own, and once the held one is given back, all are back
    assert first != second
    await held.close()
    assert pool.get_idle_size() == pool.get_size()
