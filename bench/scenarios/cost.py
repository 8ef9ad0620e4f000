"""Cost: PostgreSQL commits and broker publishes per tool call, for Tendon and the floor.

Two counts, both around a batch of sequential 1-call turns (and the same number of floor
calls), each minus the background rate measured just before and the harness's own work:

* **write commits**: transaction ids handed out (``txid_current_snapshot()``'s xmax). Only a
  transaction that writes gets one, and only a writing commit waits for a WAL flush, so this
  is the count that costs fsyncs. It is server-wide: run it on a quiet server.
* **transactions**: ``pg_stat_database.xact_commit`` of this run's own database, read-only ones
  (polls, claims that found nothing) included. A backend flushes these counters at most once
  a second, and an idle one may keep them for up to 10 s (PostgreSQL 15), so in full mode each
  reading waits 11 s first (1.5 s in quick mode: the count is rough there).

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
from bench.harness import TendonWorld, agent, one_call_agent
from bench.scenarios.base import Context, Result, Row

WIDE = 5  # calls in the one model step of the 'wide' turn


@dataclass(frozen=True)
class Reading:
    transactions: int  # pg_stat_database.xact_commit of the run's database
    xids: int  # transaction ids handed out so far, server-wide
    at: float

    def rates(self, later: Reading) -> tuple[float, float]:
        span = later.at - self.at
        return (later.transactions - self.transactions) / span, (later.xids - self.xids) / span


async def _reading(ctx: Context) -> Reading:
    await asyncio.sleep(1.5 if ctx.quick else 11.0)
    conn = await asyncpg.connect(ctx.services.admin_url)
    try:
        xids = int(await conn.fetchval("SELECT txid_snapshot_xmax(txid_current_snapshot())"))
    finally:
        await conn.close()
    return Reading(await ctx.services.xact_commits(), xids, time.monotonic())


def _per_call(
    before: Reading, after: Reading, idle: tuple[float, float], own: tuple[int, int], n: int
) -> tuple[float, float]:
    """(transactions, write commits) per call: the change minus background and harness work."""
    span = after.at - before.at
    transactions = (after.transactions - before.transactions - own[0] - idle[0] * span) / n
    writes = (after.xids - before.xids - own[1] - idle[1] * span) / n
    return transactions, writes


async def _turns(
    ctx: Context, world: TendonWorld, definition: dict[str, Any], n: int, idle: tuple[float, float]
) -> tuple[float, float]:
    """(transactions, write commits) per turn for ``n`` sequential turns of ``definition``."""
    before = await _reading(ctx)
    polls = 0
    for _ in range(n):
        tid = await world.submit(definition)
        while True:
            polls += 1
            if (await world.statuses([tid]))[tid] == "completed":
                break
            await asyncio.sleep(0.02)
    after = await _reading(ctx)
    # The harness: a submit is one write commit; a status poll one read-only transaction.
    return _per_call(before, after, idle, (n + polls, n), n)


def parallel_agent(calls: int) -> dict[str, Any]:
    """An agent whose turn makes ``calls`` calls of ``noop`` in one model step."""
    return agent(
        f"bench-noop-x{calls}", [[{"tool": "noop", "args": {"n": i}} for i in range(calls)]], ["noop"]
    )


async def run(ctx: Context) -> Result:
    n = ctx.n(20, 200)
    world = TendonWorld(ctx.services, ctx.procs, extra={"TENDON_SCAN_INTERVAL": "5"})
    single, wide = one_call_agent("noop"), parallel_agent(WIDE)
    try:
        await world.start_brain()
        await world.start_hands()
        await world.open()
        await world.wait_done([await world.submit(single), await world.submit(wide)], timeout=30)
        r0 = await _reading(ctx)
        r1 = await _reading(ctx)
        idle = r0.rates(r1)
        tendon_tx, tendon_writes = await _turns(ctx, world, single, n, idle)
        _, wide_writes = await _turns(ctx, world, wide, n // 2, idle)
        outbox = (await world.fetch("SELECT count(*) AS c FROM outbox"))[0]["c"]
        events = (await world.fetch(f'SELECT count(*) AS c FROM "{world.hands_schema}".events'))[0]["c"]
        publishes = (outbox + events) / (n + 1 + (n // 2 + 1) * WIDE)  # per call, warm-ups included
    finally:
        await world.cleanup()
    async with Floor(ctx.services.database_url, ctx.services.amqp_url) as floor:
        await floor.sequential(3)
        f0 = await _reading(ctx)
        await floor.sequential(n)
        f1 = await _reading(ctx)
        floor_tx, floor_writes = _per_call(f0, f1, (0.0, 0.0), (0, 0), n)
    ctx.notes.append(
        f"cost: Tendon background subtracted ({idle[0]:.1f} transactions/s, {idle[1]:.1f} write "
        f"commits/s, scan interval 5 s); the harness's submits and status polls "
        "subtracted; write commits are server-wide transaction ids, so a busy server inflates them"
    )
    return Result(
        rows=[
            Row(
                "cost",
                "PostgreSQL commits per tool call (write commits, 1-call turn)",
                "commits",
                tendon_writes,
                floor_writes,
                target="<= 4",
                note=f"{n} sequential turns; the turn's own commits (submit aside) included",
            ),
            Row(
                "cost",
                f"PostgreSQL commits per added tool call (write commits, {WIDE} calls in one step "
                "minus 1 call, per call)",
                "commits",
                (wide_writes - tendon_writes) / (WIDE - 1),
                floor_writes,
                note=f"{n // 2} sequential {WIDE}-call turns against the 1-call turns: what a call "
                "costs beyond the turn around it",
            ),
            Row(
                "cost",
                "PostgreSQL transactions per tool call, read-only included",
                "transactions",
                tendon_tx,
                floor_tx,
                note="pg_stat_database.xact_commit",
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
