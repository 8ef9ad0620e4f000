"""Cost: PostgreSQL commits, rows, WAL and broker publishes per tool call, Tendon and floor.

Counts around a batch of sequential 1-call turns (and the same number of floor calls), each
minus the background rate measured just before and the harness's own work:

* **write commits**: transaction ids handed out (``txid_current_snapshot()``'s xmax). Only a
  transaction that writes gets one, and only a writing commit waits for a WAL flush, so this
  is the count that costs fsyncs. It is server-wide: run it on a quiet server.
* **transactions**: ``pg_stat_database.xact_commit`` of this run's own database, read-only ones
  (polls, claims that found nothing) included. A backend flushes these counters at most once
  a second, and an idle one may keep them for up to 10 s (PostgreSQL 15), so in full mode each
  reading waits 11 s first (1.5 s in quick mode: the count is rough there).
* **rows written**: inserts, updates and deletes in the side's own schemas
  (``pg_stat_user_tables``, flushed like the transaction counts): the durable footprint of a
  call, which is most of what PostgreSQL's CPU time per call pays for.
* **WAL records and bytes** (``pg_stat_wal``, server-wide like the write commits): each row
  change writes a record, and so does each index entry it adds.

The Tendon processes run with a 5 s scan interval here, so that their periodic repair scans
(which a busy deployment pays once per interval, not per call) barely show. Publishes: the
management plugin is not enabled here, so they are counted from the rows that are published:
the Brain's ``outbox`` plus the Hands' event outbox (``events``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import asyncpg

from bench.floor import Floor
from bench.harness import TendonWorld, one_call_agent, parallel_agent
from bench.scenarios.base import Context, Result, Row
from bench.wal import WalFootprint, current_lsn, render, rows_delta, table_rows, wal_footprint

WIDE = 5  # calls in the one model step of the 'wide' turn


COUNTERS = ("transactions", "xids", "wal_records", "wal_bytes", "rows")


@dataclass(frozen=True)
class Reading:
    """Counters at one moment (see the module docstring), and when they were read."""

    counts: dict[str, int]  # COUNTERS
    at: float

    def rates(self, later: Reading) -> dict[str, float]:
        span = later.at - self.at
        return {k: (later.counts[k] - self.counts[k]) / span for k in COUNTERS}


async def _reading(ctx: Context, schemas: list[str]) -> Reading:
    """Read the counters after letting backends flush theirs. ``rows``: rows inserted, updated
    or deleted in ``schemas`` (pg_stat_user_tables of the run's database)."""
    await asyncio.sleep(1.5 if ctx.quick else 11.0)
    conn = await asyncpg.connect(ctx.services.admin_url)
    try:
        xids = int(await conn.fetchval("SELECT txid_snapshot_xmax(txid_current_snapshot())"))
        wal = await conn.fetchrow("SELECT wal_records, wal_bytes FROM pg_stat_wal")
    finally:
        await conn.close()
    conn = await asyncpg.connect(ctx.services.database_url)
    try:
        rows = await conn.fetchval(
            "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables"
            " WHERE schemaname = ANY($1::text[])",
            schemas,
        )
    finally:
        await conn.close()
    counts = {
        "transactions": await ctx.services.xact_commits(),
        "xids": xids,
        "wal_records": int(wal["wal_records"]),
        "wal_bytes": int(wal["wal_bytes"]),
        "rows": int(rows),
    }
    return Reading(counts, time.monotonic())


def _per_call(
    before: Reading, after: Reading, idle: dict[str, float], own: dict[str, int], n: int
) -> dict[str, float]:
    """Each counter per call: the change minus the background rate and the harness's own work."""
    span = after.at - before.at
    return {
        k: (after.counts[k] - before.counts[k] - own.get(k, 0) - idle.get(k, 0.0) * span) / n
        for k in COUNTERS
    }


async def _turns(
    ctx: Context, world: TendonWorld, definition: dict[str, Any], n: int, idle: dict[str, float]
) -> dict[str, float]:
    """Counters per turn for ``n`` sequential turns of ``definition``."""
    schemas = [world.brain_schema, world.hands_schema]
    before = await _reading(ctx, schemas)
    polls = 0
    for _ in range(n):
        tid = await world.submit(definition)
        while True:
            polls += 1
            if (await world.statuses([tid]))[tid] == "completed":
                break
            await asyncio.sleep(0.02)
    after = await _reading(ctx, schemas)
    # The harness: a submit is one write commit and a status poll one read-only transaction,
    # taken off those counts; the submit's rows and WAL are the turn's own and stay in.
    return _per_call(before, after, idle, {"transactions": n + polls, "xids": n}, n)


def _exact(wal: WalFootprint | None, floor: WalFootprint | None, n: int) -> list[Row]:
    """Rows and WAL records per 1-call turn read off the WAL itself (``pg_walinspect``): exact,
    where the statistics views lag (the rows) or count the whole server (the records)."""
    if wal is None or floor is None:
        return []
    note = f"{n} sequential turns, read off the WAL between them (pg_walinspect); submit included"
    return [
        Row("cost", "row versions written per 1-call turn (from the WAL)", "rows", wal.row_versions() / n,
            floor.row_versions() / n, target="<= 20", note=note + "; every insert, update (HOT too), delete"),
        Row("cost", "WAL records per 1-call turn (from the WAL)", "records", wal.total() / n,
            floor.total() / n, target="<= 60", note=note + "; commits included"),
    ]  # fmt: skip


async def run(ctx: Context) -> Result:
    n = ctx.n(20, 200)
    world = TendonWorld(ctx.services, ctx.procs, extra={"TENDON_SCAN_INTERVAL": "5"})
    single, wide = one_call_agent("noop"), parallel_agent(WIDE)
    try:
        await world.start_brain()
        await world.start_hands()
        await world.open()
        await world.wait_done([await world.submit(single), await world.submit(wide)], timeout=30)
        schemas = [world.brain_schema, world.hands_schema]
        r0 = await _reading(ctx, schemas)
        r1 = await _reading(ctx, schemas)
        idle = r0.rates(r1)
        admin = await asyncpg.connect(ctx.services.database_url)
        try:
            lsn0, rows0 = await current_lsn(admin), await table_rows(admin, schemas)
            tendon = await _turns(ctx, world, single, n, idle)
            lsn1, rows1 = await current_lsn(admin), await table_rows(admin, schemas)
            wal = await wal_footprint(admin, lsn0, lsn1)
            footprint = render(wal, rows_delta(rows0, rows1), n)
        finally:
            await admin.close()
        ctx.out.mkdir(parents=True, exist_ok=True)
        (ctx.out / "FOOTPRINT.md").write_text(
            f"# The durable footprint of a 1-call turn, by table\n\n{n} sequential 1-call turns "
            "(submit included), per turn; from the cost scenario of the same run.\n\n" + footprint
        )
        ctx.notes.append("cost: rows and WAL records per table and record type are in FOOTPRINT.md")
        wide_writes = (await _turns(ctx, world, wide, n // 2, idle))["xids"]
        outbox = (await world.fetch("SELECT count(*) AS c FROM executions"))[0]["c"]
        events = 0
        publishes = (outbox + events) / (n + 1 + (n // 2 + 1) * WIDE)  # per call, warm-ups included
    finally:
        await world.cleanup()
    async with Floor(ctx.services.database_url, ctx.services.amqp_url) as floor:
        await floor.sequential(3)
        admin = await asyncpg.connect(ctx.services.database_url)
        try:
            f0, lsn0 = await _reading(ctx, [floor.schema]), await current_lsn(admin)
            await floor.sequential(n)
            f1, lsn1 = await _reading(ctx, [floor.schema]), await current_lsn(admin)
            floor_wal = await wal_footprint(admin, lsn0, lsn1)
        finally:
            await admin.close()
        fl = _per_call(f0, f1, {}, {}, n)
    ctx.notes.append(
        f"cost: Tendon background subtracted ({idle['transactions']:.1f} transactions/s, "
        f"{idle['xids']:.1f} write commits/s, {idle['wal_records']:.1f} WAL records/s, scan interval "
        "5 s); the harness's submits and status polls subtracted from the commit counts; write commits "
        "and WAL are server-wide, so a busy server inflates them"
    )
    tendon_writes = tendon["xids"]
    return Result(
        rows=[
            Row(
                "cost",
                "PostgreSQL commits per tool call (write commits, 1-call turn)",
                "commits",
                tendon_writes,
                fl["xids"],
                target="<= 4",
                note=f"{n} sequential turns; the turn's own commits (submit aside) included",
            ),
            Row(
                "cost",
                f"PostgreSQL commits per added tool call (write commits, {WIDE} calls in one step "
                "minus 1 call, per call)",
                "commits",
                (wide_writes - tendon_writes) / (WIDE - 1),
                fl["xids"],
                note=f"{n // 2} sequential {WIDE}-call turns against the 1-call turns: what a call "
                "costs beyond the turn around it",
            ),
            Row(
                "cost",
                "PostgreSQL transactions per tool call, read-only included",
                "transactions",
                tendon["transactions"],
                fl["transactions"],
                note="pg_stat_database.xact_commit",
            ),
            Row(
                "cost",
                "rows written per tool call (inserted, updated or deleted; 1-call turn)",
                "rows",
                tendon["rows"],
                fl["rows"],
                note="pg_stat_user_tables of the side's own schemas; Tendon's submit included",
            ),
            *_exact(wal, floor_wal, n),
            Row(
                "cost",
                "WAL records per tool call (1-call turn)",
                "records",
                tendon["wal_records"],
                fl["wal_records"],
                note="pg_stat_wal, server-wide; every heap and index change is a record; submit included",
            ),
            Row(
                "cost",
                "WAL bytes per tool call (1-call turn)",
                "bytes",
                tendon["wal_bytes"],
                fl["wal_bytes"],
                note="pg_stat_wal, server-wide; submit included",
            ),
            Row(
                "cost",
                "broker publishes per tool call",
                "messages",
                publishes,
                2.0,
                note="Tendon: outbox + event rows, calls of both kinds of turn; floor: by construction",
            ),
        ]
    )
