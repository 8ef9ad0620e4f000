"""The durable footprint of a workload, table by table: WAL records and rows written.

Two measurements, for the cost scenario (or anyone) to take around a workload:

* **WAL records by relation and record type** (``pg_walinspect``, PostgreSQL 15+): read
  ``pg_current_wal_lsn()`` before and after, then :func:`wal_footprint` lists every record in
  between. A record names the blocks it changes (``block_ref``: ``blkref #0: rel
  spcoid/dboid/relfilenode fork main blk N ...``); the first block's relation file is the
  record's relation, mapped to its table or index through ``pg_class`` of this database.
  Records of other databases (the WAL is server-wide) are counted apart and left out, and so
  are records without a block (commits, running-xacts snapshots), which name no relation.
* **rows by table** (``pg_stat_user_tables``): :func:`table_rows` before and after,
  :func:`rows_delta` between them. A backend flushes these counters at most once a second and
  an idle one may hold them up to 10 s (PostgreSQL 15), so wait before each reading, as the
  cost scenario does.

:func:`render` writes both per call as Markdown tables. Parsing and counting are pure functions,
tested without a server. Where ``pg_walinspect`` is not available, :func:`wal_footprint`
returns ``None`` and only the rows are measured.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import asyncpg

# The first block a record references; PostgreSQL 15 prints "blkref #0: rel 1663/5/16384 fork
# main blk 0" (and "FPW" after a full-page image), one such group per block.
_BLOCK = re.compile(r"blkref #\d+: rel (\d+)/(\d+)/(\d+)")


# The heap records that each write one row version (``+INIT``: the same, on a new page).
ROW_RECORDS = frozenset({"Heap/INSERT", "Heap/UPDATE", "Heap/HOT_UPDATE", "Heap/DELETE"})


@dataclass(frozen=True)
class RelFile:
    """Where a relation's blocks live: tablespace, database and file node (as WAL names them)."""

    spcoid: int
    dboid: int
    relfilenode: int


def first_block(block_ref: str | None) -> RelFile | None:
    """The relation file of a record's first block reference; ``None`` for a record without."""
    m = _BLOCK.search(block_ref or "")
    return RelFile(int(m[1]), int(m[2]), int(m[3])) if m else None


@dataclass
class WalFootprint:
    """WAL records between two LSNs, counted for one database.

    ``records``: (relation, ``resource_manager/record_type``) -> records whose first block is in
    that relation. ``no_block``: record type -> records that name no block (server-wide: a
    commit does not say its database). ``other_databases``: records left out because their
    first block is in another database or a shared catalog.
    """

    records: dict[tuple[str, str], int] = field(default_factory=dict)
    no_block: dict[str, int] = field(default_factory=dict)
    other_databases: int = 0

    def row_versions(self) -> int:
        """Row versions written (inserted, updated or deleted rows), read off the heap records:
        exact, where ``pg_stat_user_tables`` lags behind by up to a flush interval."""
        return sum(n for (_, kind), n in self.records.items() if kind.split("+")[0] in ROW_RECORDS)

    def total(self) -> int:
        """Every record of this database, and the records without a block (commits)."""
        return sum(self.records.values()) + sum(self.no_block.values())

    def by_relation(self) -> dict[str, int]:
        totals: Counter[str] = Counter()
        for (relation, _), n in self.records.items():
            totals[relation] += n
        return dict(totals)


def relation_name(names: Mapping[tuple[int, int], str], rel: RelFile) -> str:
    """The relation of ``rel`` in ``names`` ((tablespace, file node) -> schema.name); a file no
    relation has now (dropped, or rewritten by TRUNCATE, VACUUM FULL, CLUSTER) by its node."""
    return names.get((rel.spcoid, rel.relfilenode), f"(relfilenode {rel.spcoid}/{rel.relfilenode})")


def aggregate_wal(
    records: Iterable[tuple[str, str, str | None, int]],
    dboid: int,
    names: Mapping[tuple[int, int], str],
) -> WalFootprint:
    """Count ``(resource_manager, record_type, block_ref, count)`` rows for database ``dboid``.

    ``count`` lets the caller group identical rows first; a row per record has a count of 1.
    """
    out = WalFootprint()
    counts: Counter[tuple[str, str]] = Counter()
    no_block: Counter[str] = Counter()
    for rmgr, rtype, block_ref, n in records:
        kind = f"{rmgr}/{rtype}"
        rel = first_block(block_ref)
        if rel is None:
            no_block[kind] += n
        elif rel.dboid != dboid:
            out.other_databases += n
        else:
            counts[(relation_name(names, rel), kind)] += n
    out.records, out.no_block = dict(counts), dict(no_block)
    return out


@asynccontextmanager
async def _connected(db: asyncpg.Connection | str) -> AsyncIterator[asyncpg.Connection]:
    """The given connection, or one opened (and closed) on the given URL."""
    if not isinstance(db, str):
        yield db
        return
    conn = await asyncpg.connect(db)
    try:
        yield conn
    finally:
        await conn.close()


async def current_lsn(conn: asyncpg.Connection) -> str:
    """``pg_current_wal_lsn()`` as text: read it before and after the workload."""
    return str(await conn.fetchval("SELECT pg_current_wal_lsn()::text"))


async def walinspect_schema(conn: asyncpg.Connection) -> str | None:
    """The schema of ``pg_walinspect`` in this database, creating the extension if the server
    has it (superuser, or a role allowed to create it); ``None`` if the server does not."""
    if not await conn.fetchval("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_walinspect'"):
        return None
    await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    return str(
        await conn.fetchval(
            "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
            " WHERE e.extname = 'pg_walinspect'"
        )
    )


async def relation_files(conn: asyncpg.Connection) -> tuple[int, dict[tuple[int, int], str]]:
    """This database's oid, and (tablespace, file node) -> ``schema.name`` of its relations.

    ``pg_relation_filenode`` rather than ``relfilenode``: the mapped catalogs (``pg_class``
    itself...) have 0 there. A tablespace of 0 is the database's default one.
    """
    db = await conn.fetchrow("SELECT oid, dattablespace FROM pg_database WHERE datname = current_database()")
    dboid, default_spc = int(db["oid"]), int(db["dattablespace"])
    rows = await conn.fetch(
        "SELECT c.reltablespace AS spc, pg_relation_filenode(c.oid) AS node,"
        " n.nspname || '.' || c.relname AS name"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE pg_relation_filenode(c.oid) IS NOT NULL"
    )
    return dboid, {(int(r["spc"]) or default_spc, int(r["node"])): r["name"] for r in rows}


async def _flushed(conn: asyncpg.Connection, lsn: str, timeout: float) -> None:
    """Wait until the WAL is flushed past ``lsn``: PostgreSQL 15's pg_walinspect refuses an
    end beyond the flush point, and ``pg_current_wal_lsn()`` is the write point (the WAL
    writer flushes it within ``wal_writer_delay``, 200 ms by default)."""
    deadline = time.monotonic() + timeout
    while not await conn.fetchval("SELECT pg_current_wal_flush_lsn() >= $1::text::pg_lsn", lsn):
        if time.monotonic() > deadline:
            raise TimeoutError(f"WAL not flushed past {lsn} within {timeout}s")
        await asyncio.sleep(0.05)


async def wal_footprint(
    db: asyncpg.Connection | str, start_lsn: str, end_lsn: str, *, timeout: float = 10.0
) -> WalFootprint | None:
    """WAL records from ``start_lsn`` to ``end_lsn`` by relation and record type, for the
    database ``db`` is connected to (an admin connection, or its URL); ``None`` when the
    server has no ``pg_walinspect``. The WAL in between must still be on disk: read it soon
    after the workload (a checkpoint may recycle segments older than its redo point)."""
    async with _connected(db) as conn:
        schema = await walinspect_schema(conn)
        if schema is None:
            return None
        if await conn.fetchval("SELECT $1::text::pg_lsn >= $2::text::pg_lsn", start_lsn, end_lsn):
            return WalFootprint()
        await _flushed(conn, end_lsn, timeout)
        dboid, names = await relation_files(conn)
        # Grouped by the text before the first " fork ": records of one relation and type
        # come back as one row, however many blocks they touched; the parse stays in Python.
        rows = await conn.fetch(
            "SELECT resource_manager, record_type, split_part(block_ref, ' fork ', 1) AS ref,"
            f' count(*) AS n FROM "{schema}".pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)'
            " GROUP BY 1, 2, 3",
            start_lsn,
            end_lsn,
        )
    return aggregate_wal(((r[0], r[1], r[2], int(r[3])) for r in rows), dboid, names)


@dataclass(frozen=True)
class TableRows:
    """Row counters of one table (``pg_stat_user_tables``); ``hot_updated`` is part of ``updated``."""

    inserted: int = 0
    updated: int = 0
    hot_updated: int = 0
    deleted: int = 0

    @property
    def written(self) -> int:
        return self.inserted + self.updated + self.deleted

    def minus(self, earlier: TableRows) -> TableRows:
        return TableRows(
            self.inserted - earlier.inserted,
            self.updated - earlier.updated,
            self.hot_updated - earlier.hot_updated,
            self.deleted - earlier.deleted,
        )


async def table_rows(db: asyncpg.Connection | str, schemas: list[str]) -> dict[str, TableRows]:
    """``schema.table`` -> its row counters now, for the tables of ``schemas``."""
    async with _connected(db) as conn:
        await conn.execute("SELECT pg_stat_clear_snapshot()")  # a fresh read inside a transaction too
        rows = await conn.fetch(
            "SELECT schemaname || '.' || relname AS name, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del"
            " FROM pg_stat_user_tables WHERE schemaname = ANY($1::text[])",
            schemas,
        )
    return {
        r["name"]: TableRows(
            int(r["n_tup_ins"]), int(r["n_tup_upd"]), int(r["n_tup_hot_upd"]), int(r["n_tup_del"])
        )
        for r in rows
    }


def rows_delta(before: Mapping[str, TableRows], after: Mapping[str, TableRows]) -> dict[str, TableRows]:
    """What each table gained between two readings; a table made in between starts from 0, and
    tables without a change are left out."""
    delta = {name: now.minus(before.get(name, TableRows())) for name, now in after.items()}
    return {name: d for name, d in delta.items() if d != TableRows()}


def _num(value: float) -> str:
    return f"{value:.2f}" if abs(value) < 10 else f"{value:,.1f}"


def render(wal: WalFootprint | None, rows: Mapping[str, TableRows] | None, calls: float) -> str:
    """Markdown tables of the footprint per call, largest first: WAL records by relation and
    record type (or a line saying pg_walinspect was not available), then rows by table."""
    per = 1.0 / calls if calls else float("nan")
    parts: list[str] = []
    if wal is None:
        parts.append("WAL records by relation: not measured (pg_walinspect is not available).\n")
    else:
        lines = ["| relation | WAL record | per call |", "| --- | --- | ---: |"]
        for (relation, kind), n in sorted(wal.records.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"| {relation} | {kind} | {_num(n * per)} |")
        lines.append(f"| **all relations** | | **{_num(sum(wal.records.values()) * per)}** |")
        no_block = ", ".join(
            f"{kind} {_num(n * per)}"
            for kind, n in sorted(wal.no_block.items(), key=lambda kv: (-kv[1], kv[0]))
        )
        parts.append(
            "\n".join(lines) + f"\n\nRecords without a block (server-wide), per call: {no_block or 'none'}; "
            f"records of other databases left out: {wal.other_databases}.\n"
        )
    if rows is not None:
        lines = [
            "| table | inserted | updated | of them HOT | deleted | written |",
            "| --- |" + " ---: |" * 5,
        ]
        for name, r in sorted(rows.items(), key=lambda kv: (-kv[1].written, kv[0])):
            figures = (r.inserted, r.updated, r.hot_updated, r.deleted, r.written)
            lines.append(f"| {name} | " + " | ".join(_num(v * per) for v in figures) + " |")
        total = sum(r.written for r in rows.values())
        lines.append(f"| **all tables** | | | | | **{_num(total * per)}** |")
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)
