"""The SQLite adapter under the embedded mode: translation, transactions, passing faults."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from infra.db import is_transient, transact
from infra.sqlite import open_pool, translate


@pytest.mark.parametrize(
    ("postgres", "sqlite"),
    [
        ("SELECT * FROM t WHERE id = $1 AND n = $2", "SELECT * FROM t WHERE id = ?1 AND n = ?2"),
        (
            "UPDATE t SET x = 1 WHERE id = ANY($1::text[])",
            "UPDATE t SET x = 1 WHERE id IN (SELECT value FROM json_each(?1))",
        ),
        ("SELECT now() + make_interval(secs => $1)", "SELECT ts_add(now(), +(?1))"),
        (
            "SELECT 1 FROM t WHERE a < now() - make_interval(secs => $1 * 4)",
            "SELECT 1 FROM t WHERE a < ts_add(now(), -(?1 * 4))",
        ),
        ("SELECT id FROM t FOR UPDATE OF t SKIP LOCKED", "SELECT id FROM t"),
        ("UPDATE t AS x SET n = 1 RETURNING x.*", "UPDATE t AS x SET n = 1 RETURNING *"),
        ("SELECT GREATEST(a, b) FROM t", "SELECT max(a, b) FROM t"),
    ],
)
def test_postgresql_spellings_are_rewritten_to_sqlite(postgres: str, sqlite: str) -> None:
    assert translate(postgres) == sqlite


@pytest.mark.parametrize(
    "sql",
    ["SELECT DISTINCT ON (a) a FROM t", "SELECT pg_advisory_lock(1)", "UPDATE t SET n = 1 RETURNING x.id"],
)
def test_sql_without_a_translation_fails_loudly_instead_of_meaning_something_else(sql: str) -> None:
    with pytest.raises(NotImplementedError, match="no SQLite translation"):
        translate(sql)


async def test_a_transaction_cut_short_by_a_cancel_leaves_nothing_behind(tmp_path: Path) -> None:
    pool = await open_pool(tmp_path / "t.sqlite3")
    try:
        await pool.execute("CREATE TABLE t (n int)")
        started = asyncio.Event()

        async def slow(conn):  # type: ignore[no-untyped-def]
            await conn.execute("INSERT INTO t VALUES (1)")
            started.set()
            await asyncio.sleep(10)

        task = asyncio.create_task(transact(pool, slow))
        await asyncio.wait_for(started.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The next holder starts clean, and the cancelled insert never committed
        await transact(pool, lambda c: c.execute("INSERT INTO t VALUES (2)"))
        assert [r["n"] for r in await pool.fetch("SELECT n FROM t")] == [2]
    finally:
        await pool.close()


def test_a_file_busy_in_another_process_is_a_passing_fault(tmp_path: Path) -> None:
    path = tmp_path / "busy.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None)
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError) as busy:
            other.execute("BEGIN IMMEDIATE")
        assert is_transient(busy.value)
        assert not is_transient(sqlite3.OperationalError("no such table: t"))
    finally:
        holder.close()
        other.close()
