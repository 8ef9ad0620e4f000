"""The durable footprint by table (``bench/wal.py``): parsing and counting without a server, and
one run on the local PostgreSQL that finds a table's and its index's WAL records."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from bench.wal import (
    RelFile,
    TableRows,
    WalFootprint,
    aggregate_wal,
    current_lsn,
    first_block,
    render,
    rows_delta,
    table_rows,
    wal_footprint,
)

DB = 16384
NAMES = {(1663, 100): "app.jobs", (1663, 101): "app.jobs_pkey"}


def test_the_first_block_of_a_record_names_its_relation_file() -> None:
    ref = "blkref #0: rel 1663/16384/100 fork main blk 1 blkref #2: rel 1663/16384/101 fork main blk 0"

    assert first_block(ref) == RelFile(1663, DB, 100)
    assert first_block("blkref #0: rel 1663/16384/100 fork vm blk 0 FPW") == RelFile(1663, DB, 100)
    assert first_block("blkref #0: rel 1663/16384/100") == RelFile(1663, DB, 100)  # cut at " fork "


@pytest.mark.parametrize("ref", [None, "", "xid 735 committed"])
def test_a_record_without_a_block_names_no_relation(ref: str | None) -> None:
    assert first_block(ref) is None


def test_records_are_counted_by_relation_and_type_for_this_database_only() -> None:
    # Given records of this database, of another one, a shared catalog and a commit
    records = [
        ("Heap", "INSERT", "blkref #0: rel 1663/16384/100 fork main blk 0", 2),
        ("Heap", "INSERT", "blkref #0: rel 1663/16384/100 fork main blk 7", 1),
        ("Heap", "HOT_UPDATE", "blkref #0: rel 1663/16384/100 fork main blk 0", 1),
        ("Btree", "INSERT_LEAF", "blkref #0: rel 1663/16384/101 fork main blk 1", 3),
        ("Heap", "INSERT", "blkref #0: rel 1663/99999/100 fork main blk 0", 5),
        ("Heap", "INPLACE", "blkref #0: rel 1664/0/1262 fork main blk 0", 1),
        ("Heap", "DELETE", "blkref #0: rel 1663/16384/555 fork main blk 0", 1),
        ("Transaction", "COMMIT", None, 4),
    ]

    # When they are counted
    wal = aggregate_wal(records, DB, NAMES)

    # Then each relation of this database has its records by type, the rest is set apart
    assert wal.records == {
        ("app.jobs", "Heap/INSERT"): 3,
        ("app.jobs", "Heap/HOT_UPDATE"): 1,
        ("app.jobs_pkey", "Btree/INSERT_LEAF"): 3,
        ("(relfilenode 1663/555)", "Heap/DELETE"): 1,  # dropped or rewritten since
    }
    assert wal.no_block == {"Transaction/COMMIT": 4}
    assert wal.other_databases == 6
    assert wal.by_relation() == {"app.jobs": 4, "app.jobs_pkey": 3, "(relfilenode 1663/555)": 1}


def test_row_versions_are_counted_off_the_heap_records_and_the_total_includes_commits() -> None:
    wal = WalFootprint(
        records={
            ("app.jobs", "Heap/INSERT"): 3, ("app.jobs", "Heap/INSERT+INIT"): 1,
            ("app.jobs", "Heap/HOT_UPDATE"): 2, ("app.jobs", "Heap/UPDATE+INIT"): 1,
            ("app.jobs", "Heap/DELETE"): 1, ("app.jobs", "Heap/LOCK"): 5, ("app.jobs", "Heap2/PRUNE"): 2,
            ("app.jobs_pkey", "Btree/INSERT_LEAF"): 4,
        },
        no_block={"Transaction/COMMIT": 3},
    )  # fmt: skip
    assert wal.row_versions() == 8  # not the locks, prunes or index entries
    assert wal.total() == 19 + 3


def test_rows_are_what_each_table_gained_and_a_new_table_starts_from_zero() -> None:
    before = {"app.jobs": TableRows(10, 4, 3, 1), "app.idle": TableRows(5)}
    after = {"app.jobs": TableRows(16, 10, 8, 2), "app.idle": TableRows(5), "app.new": TableRows(2)}

    assert rows_delta(before, after) == {"app.jobs": TableRows(6, 6, 5, 1), "app.new": TableRows(2)}
    assert TableRows(6, 6, 5, 1).written == 13  # HOT updates are part of the updates


def test_the_tables_are_per_call_and_largest_first() -> None:
    wal = WalFootprint(
        records={("app.jobs", "Heap/INSERT"): 20, ("app.jobs_pkey", "Btree/INSERT_LEAF"): 40},
        no_block={"Transaction/COMMIT": 30},
        other_databases=7,
    )
    rows = {"app.jobs": TableRows(10, 20, 20, 0), "app.log": TableRows(40)}

    text = render(wal, rows, calls=10)

    lines = text.splitlines()
    assert lines.index("| app.jobs_pkey | Btree/INSERT_LEAF | 4.00 |") < lines.index(
        "| app.jobs | Heap/INSERT | 2.00 |"
    )
    assert "| **all relations** | | **6.00** |" in lines
    assert "Transaction/COMMIT 3.00" in text and "other databases left out: 7" in text
    assert lines.index("| app.log | 4.00 | 0.00 | 0.00 | 0.00 | 4.00 |") < lines.index(
        "| app.jobs | 1.00 | 2.00 | 2.00 | 0.00 | 3.00 |"
    )
    assert "| **all tables** | | | | | **7.00** |" in lines


def test_without_walinspect_the_rows_are_rendered_alone() -> None:
    text = render(None, {"app.jobs": TableRows(1)}, calls=1)

    assert "pg_walinspect is not available" in text
    assert "| app.jobs | 1.00 |" in text


async def test_a_tables_and_its_indexs_records_are_found_between_two_lsns(pg_url: str) -> None:
    # Given a scratch schema with an indexed table (pg_walinspect inside it, if this database
    # has none yet, so that dropping the schema removes everything the test made)
    conn = await asyncpg.connect(pg_url)
    schema = f"walt_{uuid.uuid4().hex[:8]}"
    try:
        if not await conn.fetchval("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_walinspect'"):
            pytest.skip("pg_walinspect is not available on this server")
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        if not await conn.fetchval("SELECT 1 FROM pg_extension WHERE extname = 'pg_walinspect'"):
            await conn.execute(f'CREATE EXTENSION pg_walinspect SCHEMA "{schema}"')
        await conn.execute(f'CREATE TABLE "{schema}".jobs (id int PRIMARY KEY, state text NOT NULL)')
        await conn.execute(f'CREATE INDEX jobs_state ON "{schema}".jobs (state)')
        rows_before = await table_rows(conn, [schema])
        start = await current_lsn(conn)

        # When a few rows are inserted and updated
        await conn.execute(f"INSERT INTO \"{schema}\".jobs SELECT g, 'new' FROM generate_series(1, 5) g")
        await conn.execute(f"UPDATE \"{schema}\".jobs SET state = 'done' WHERE id <= 2")
        end = await current_lsn(conn)
        wal = await wal_footprint(conn, start, end)

        # Then the table's and both indexes' records are there, by type
        assert wal is not None
        assert wal.records[(f"{schema}.jobs", "Heap/INSERT")] >= 4  # the first may be INSERT+INIT
        assert wal.records[(f"{schema}.jobs", "Heap/UPDATE")] == 2  # state is indexed: not HOT
        assert wal.records[(f"{schema}.jobs_pkey", "Btree/INSERT_LEAF")] >= 5
        assert wal.records[(f"{schema}.jobs_state", "Btree/INSERT_LEAF")] >= 5
        assert wal.no_block.get("Transaction/COMMIT", 0) >= 2
        # The statistics arrive when this backend flushes them (here: at once, on request)
        await conn.execute("SELECT pg_stat_force_next_flush()")
        delta = rows_delta(rows_before, await table_rows(conn, [schema]))
        assert delta[f"{schema}.jobs"] == TableRows(inserted=5, updated=2, hot_updated=0, deleted=0)
        assert f"| {schema}.jobs | Heap/UPDATE | 2.00 |" in render(wal, delta, calls=1)
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()
