"""Group commit (infra.groupcommit) on PostgreSQL and the embedded SQLite store: changes from
concurrent callers share transactions, yet each one still commits whole or not at all."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from brain.app import open_store
from infra.db import transact
from infra.groupcommit import GroupCommit
from infra.sqlite import open_pool
from tests.support import TendonEnv


@pytest.fixture(params=["postgres", "sqlite"])
async def pool(request: pytest.FixtureRequest, tmp_path: Path, tendon: TendonEnv) -> AsyncIterator[Any]:
    p: Any = (
        await open_store(tendon.settings())
        if request.param == "postgres"
        else await open_pool(tmp_path / "probe.sqlite3")
    )

    async def tables(conn: Any) -> None:
        await conn.execute("CREATE TABLE probe_a (id integer PRIMARY KEY, note text)")
        await conn.execute("CREATE TABLE probe_b (id integer PRIMARY KEY, note text)")

    await transact(p, tables)
    yield p
    await p.close()


async def _two_rows(conn: Any, item: tuple[int, int]) -> int:
    """One change = two rows; the second insert is where a bad change fails."""
    a, b = item
    await conn.execute("INSERT INTO probe_a (id, note) VALUES ($1, 'a')", a)
    await conn.execute("INSERT INTO probe_b (id, note) VALUES ($1, 'b')", b)
    return a


async def _ids(pool: Any, table: str) -> list[int]:
    async with pool.acquire() as conn:
        return [r["id"] for r in await conn.fetch(f"SELECT id FROM {table} ORDER BY id")]


async def test_changes_submitted_together_commit_in_one_transaction(pool: Any) -> None:
    # Given twenty callers submitting at once
    group: GroupCommit[tuple[int, int], int] = GroupCommit(pool, _two_rows)

    # When they all submit
    results = await asyncio.gather(*(group.submit((i, i)) for i in range(20)))

    # Then each got its own result, all rows are there, and it took one transaction
    assert results == list(range(20))
    assert await _ids(pool, "probe_a") == list(range(20))
    assert (group.batches, group.items) == (1, 20)


async def test_a_bad_change_fails_only_its_caller_and_leaves_nothing_half_done(pool: Any) -> None:
    # Given a row that change 7's second insert will collide with
    async with pool.acquire() as conn:
        await conn.execute("INSERT INTO probe_b (id, note) VALUES (1007, 'taken')")
    group: GroupCommit[tuple[int, int], int] = GroupCommit(pool, _two_rows)

    # When ten callers submit at once, change 7 among them
    results = await asyncio.gather(
        *(group.submit((i, 1007 if i == 7 else i)) for i in range(10)), return_exceptions=True
    )

    # Then only change 7 failed, with the database's own error, and none of its rows stayed
    assert [i for i, r in enumerate(results) if isinstance(r, Exception)] == [7]
    assert "unique" in str(results[7]).lower()
    assert await _ids(pool, "probe_a") == [0, 1, 2, 3, 4, 5, 6, 8, 9]
    assert await _ids(pool, "probe_b") == [0, 1, 2, 3, 4, 5, 6, 8, 9, 1007]


async def test_a_batch_is_applied_in_the_given_order(pool: Any) -> None:
    seen: list[int] = []

    async def record(conn: Any, item: int) -> None:
        seen.append(item)

    group: GroupCommit[int, None] = GroupCommit(pool, record, order=lambda item: item)
    await asyncio.gather(*(group.submit(i) for i in (5, 3, 9, 1)))
    assert seen == [1, 3, 5, 9]


async def test_a_lone_change_goes_alone_when_it_can_and_the_usual_way_when_it_cannot(pool: Any) -> None:
    # Given a group whose lone changes may commit as one statement with no transaction,
    # except odd ids (their ``alone`` declines) and id 4 (its ``alone`` fails)
    alone_in_transaction: list[bool] = []

    async def alone(conn: Any, item: tuple[int, int]) -> int | None:
        if hasattr(conn, "is_in_transaction"):  # asyncpg: nothing around the statement
            alone_in_transaction.append(conn.is_in_transaction())
        if item[0] == 4:
            raise ValueError("this one cannot go alone")
        if item[0] % 2:
            return None
        await conn.execute("INSERT INTO probe_a (id, note) VALUES ($1, 'alone')", item[0])
        return item[0]

    group: GroupCommit[tuple[int, int], int] = GroupCommit(pool, _two_rows, alone=alone)

    # When changes come one at a time
    results = [await group.submit((i, i)) for i in range(6)]

    # Then each is applied once: the even ones alone (no probe_b row), the others, and the
    # one whose ``alone`` failed, by ``apply`` in a transaction
    assert results == list(range(6))
    assert await _ids(pool, "probe_a") == list(range(6))
    assert await _ids(pool, "probe_b") == [1, 3, 4, 5]
    assert not any(alone_in_transaction)
