"""Cost: PostgreSQL commits and broker publishes per tool call, for Tendon and the floor.

Commits: ``pg_stat_database.xact_commit`` of this run's own database around a batch of
sequential 1-call turns, minus the background rate measured just before (scanners, liveness)
and minus the harness's own transactions (submits and status polls, counted). PostgreSQL
flushes backend counters at most once a second, so each reading waits 1.5 s first.
Publishes: the management plugin is not enabled here, so publishes are counted from the rows
that are published: the Brain's ``outbox`` plus the Hands' event outbox (``events``).
"""

from __future__ import annotations

import asyncio
import time

from bench.floor import Floor
from bench.harness import TendonWorld, one_call_agent
from bench.scenarios.base import Context, Result, Row

SETTLE = 1.5


async def _reading(ctx: Context) -> tuple[int, float]:
    await asyncio.sleep(SETTLE)
    return await ctx.services.xact_commits(), time.monotonic()


async def run(ctx: Context) -> Result:
    n = ctx.n(20, 200)
    world = TendonWorld(ctx.services, ctx.procs)
    try:
        await world.start_brain()
        await world.start_hands()
        await world.open()
        definition = one_call_agent("noop")
        await world.wait_done([await world.submit(definition)], timeout=30)
        c0, t0 = await _reading(ctx)
        c1, t1 = await _reading(ctx)
        idle_rate = (c1 - c0 - 1) / (t1 - t0)  # the reading itself commits once
        polls = 0
        ids = []
        for _ in range(n):
            tid = await world.submit(definition)
            ids.append(tid)
            while True:
                polls += 1
                if (await world.statuses([tid]))[tid] == "completed":
                    break
                await asyncio.sleep(0.02)
        c2, t2 = await _reading(ctx)
        harness = n + polls + 1  # submits, status polls, the reading
        tendon_commits = (c2 - c1 - harness - idle_rate * (t2 - t1)) / n
        outbox = (await world.fetch("SELECT count(*) AS c FROM outbox"))[0]["c"]
        events = (await world.fetch(f'SELECT count(*) AS c FROM "{world.hands_schema}".events'))[0]["c"]
        publishes = (outbox + events) / (n + 1)
    finally:
        await world.cleanup()
    async with Floor(ctx.services.database_url, ctx.services.amqp_url) as floor:
        await floor.sequential(3)
        f0, _ = await _reading(ctx)
        await floor.sequential(n)
        f1, _ = await _reading(ctx)
        floor_commits = (f1 - f0 - 1) / n
    ctx.notes.append(
        f"cost: Tendon background commit rate {idle_rate:.1f}/s subtracted; harness's own "
        f"{harness} transactions subtracted; publishes counted from outbox + ledger event rows"
    )
    return Result(
        rows=[
            Row(
                "cost",
                "PostgreSQL commits per tool call (1-call turn)",
                "commits",
                tendon_commits,
                floor_commits,
                target="<= 4",
                note=f"{n} sequential turns, includes the turn's own commits",
            ),
            Row(
                "cost",
                "broker publishes per tool call (1-call turn)",
                "messages",
                publishes,
                2.0,
                note="Tendon: outbox + event rows; floor: by construction",
            ),
        ]
    )
