"""Group commit (infra.db.groupcommit) on PostgreSQL and the embedded SQLite store: changes from
concurrent callers share transactions, yet each one still commits whole or not at all."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from infra.db import create_pool, transact
from infra.db.groupcommit import GroupCommit
from infra.db.sqlite import open_pool
from tests.support import TendonEnv


@pytest.fixture(params=["postgres", "sqlite"])
async def pool(request: pytest.FixtureRequest, tmp_path: Path, tendon: TendonEnv) -> AsyncIterator[Any]:
    p: Any = (
        await create_pool(tendon.database_url, tendon.settings().brain_schema)
        if request.param == "postgres"
        else await open_pool(tmp_path / "probe.sqlite3")
    )
    if request.param == "postgres":
        await p.execute(f"CREATE SCHEMA IF NOT EXISTS {tendon.settings().brain_schema}")

    async def tables(conn: Any) -> None:
        await conn.execute("CREATE TABLE probe_a (id integer PRIMARY KEY, note text)")
        await conn.execute("CREATE TABLE probe_b (id integer PRIMARY KEY, note text)")

    await transact(p, tables)
    yield p
    await p.close()


async def _two_rows(conn: Any, items: list[tuple[int, int]]) -> list[int | BaseException]:
    """A batch of changes, each two rows; the second insert is where a bad change fails. A change
    whose first id is negative is refused before anything of it is written (its caller is told)."""
    out: list[int | BaseException] = []
    for a, b in items:
        if a < 0:
            out.append(ValueError(f"change {a} refused"))
            continue
        await conn.execute("INSERT INTO probe_a (id, note) VALUES ($1, 'a')", a)
        await conn.execute("INSERT INTO probe_b (id, note) VALUES ($1, 'b')", b)
        out.append(a)
    return out


async def _ids(pool: Any, table: str) -> list[int]:
    async with pool.acquire() as conn:
        return [r["id"] for r in await conn.fetch(f"SELECT id FROM {table} ORDER BY id")]


def _group(pool: Any, apply: Any = _two_rows, **options: Any) -> GroupCommit[Any, Any]:
    return GroupCommit(lambda work, **kw: transact(pool, work, **kw), apply, name="probe", **options)


async def test_changes_submitted_together_commit_in_one_transaction(pool: Any) -> None:
    # Given twenty callers submitting at once
    group = _group(pool)

    # When they all submit
    results = await asyncio.gather(*(group.submit((i, i)) for i in range(20)))

    # Then each got its own result, all rows are there, and it took one transaction
    assert results == list(range(20))
    assert await _ids(pool, "probe_a") == list(range(20))
    assert (group.batches, group.items, group.stats()["sizes"]) == (1, 20, {20: 1})


async def test_a_bad_change_fails_only_its_caller_and_leaves_nothing_half_done(pool: Any) -> None:
    # Given a row that change 7's second insert will collide with
    async with pool.acquire() as conn:
        await conn.execute("INSERT INTO probe_b (id, note) VALUES (1007, 'taken')")
    group = _group(pool)

    # When ten callers submit at once, change 7 among them, and change -3 that the batch refuses
    changes = [(i, 1007 if i == 7 else i) for i in range(10)] + [(-3, 3)]
    results = await asyncio.gather(*(group.submit(c) for c in changes), return_exceptions=True)

    # Then only changes 7 and -3 failed, each with its own error, and none of their rows stayed
    assert [i for i, r in enumerate(results) if isinstance(r, Exception)] == [7, 10]
    assert "unique" in str(results[7]).lower() and "change -3 refused" in str(results[10])
    assert await _ids(pool, "probe_a") == [0, 1, 2, 3, 4, 5, 6, 8, 9]
    assert await _ids(pool, "probe_b") == [0, 1, 2, 3, 4, 5, 6, 8, 9, 1007]


async def test_a_batch_is_applied_in_the_given_order(pool: Any) -> None:
    seen: list[int] = []

    async def record(conn: Any, items: list[int]) -> list[None]:
        seen.extend(items)
        return [None] * len(items)

    group = _group(pool, record, order=lambda item: item)
    await asyncio.gather(*(group.submit(i) for i in (5, 3, 9, 1)))
    assert seen == [1, 3, 5, 9]


async def test_a_batch_of_one_statement_commits_without_a_transaction_around_it(pool: Any) -> None:
    # Given a group that writes single changes with one statement
    in_transaction: list[bool] = []

    async def one(conn: Any, items: list[tuple[int, int]]) -> list[int]:
        if hasattr(conn, "is_in_transaction"):  # asyncpg: nothing around the statement
            in_transaction.append(conn.is_in_transaction())
        await conn.execute("INSERT INTO probe_a (id, note) VALUES ($1, 'one')", items[0][0])
        return [items[0][0]]

    group = _group(pool, one, single=lambda items: len(items) == 1)
    assert [await group.submit((i, i)) for i in range(3)] == [0, 1, 2]
    assert await _ids(pool, "probe_a") == [0, 1, 2]
    assert not any(in_transaction)


async def test_a_change_committed_after_its_caller_gave_up_is_told_to_whoever_must_not_lose_it(pool):
    # Given a committer whose transaction is held open until the test lets it through, and a
    # caller inside it
    gate, inside = asyncio.Event(), asyncio.Event()
    orphans: list[Any] = []

    async def held(conn: Any, items: list[tuple[int, int]]) -> list[int | BaseException]:
        inside.set()
        await gate.wait()
        return await _two_rows(conn, items)

    group = _group(pool, held, orphaned=orphans.append)
    caller = asyncio.create_task(group.submit((7, 7)))
    await asyncio.wait_for(inside.wait(), 10)

    # When the caller is cancelled (a consumer whose channel closed), and the commit then goes on
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    gate.set()
    for _ in range(200):
        if orphans:
            break
        await asyncio.sleep(0.01)

    # Then the change is committed and its result reaches the one told of orphans, not nowhere
    assert orphans == [7]
    assert await _ids(pool, "probe_a") == [7]
