"""The SQLite adapter under the embedded mode: parameters, functions, transactions, passing faults."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest

from infra.db import is_transient, transact
from infra.db.sqlite import open_pool, parse_ts, placeholders


def test_numbered_parameters_become_sqlites_and_nothing_else_is_rewritten() -> None:
    assert placeholders("SELECT * FROM t WHERE id = $1 AND n = $2 OR m = $12") == (
        "SELECT * FROM t WHERE id = ?1 AND n = ?2 OR m = ?12"
    )
    # What differs between the dialects is the stores' business (a backend each), not the adapter's.
    assert (
        placeholders("SELECT ts_add(now(), $1) FROM t FOR UPDATE")
        == "SELECT ts_add(now(), ?1) FROM t FOR UPDATE"
    )


async def test_the_functions_the_portable_sql_calls_exist_here(tmp_path: Path) -> None:
    pool = await open_pool(tmp_path / "t.sqlite3")
    try:
        # Read once, then added to: two calls of now() in one statement may straddle a millisecond.
        now = await pool.fetchval("SELECT now()")
        later = await pool.fetchval("SELECT ts_add($1, $2)", now, 1.5)
        assert parse_ts(later) - parse_ts(now) == timedelta(seconds=1.5)
        assert await pool.fetchval("SELECT ts_add(NULL, 1)") is None
    finally:
        await pool.close()


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
