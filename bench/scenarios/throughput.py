"""Throughput: tool calls per second with 1, 10 and 50 in flight (closed loop).

Tendon: one Brain, a Hands pool of 2 processes; each in-flight unit is a 1-call turn (so a
Tendon "call" here also carries its turn: submit, two scripted model steps, finalize). The
harness keeps K turns in flight and resubmits as it sees completions (polled every 10 ms).
Floor, Celery and DBOS (full mode) run the same closed loop with K calls / tasks / one-step
workflows in flight.
"""

from __future__ import annotations

import asyncio
import time

from bench.floor import Floor
from bench.harness import TendonWorld, median, one_call_agent
from bench.peers import celery_bench, dbos_bench
from bench.scenarios.base import Context, Result, Row


async def tendon_closed_loop(world: TendonWorld, in_flight: int, duration: float) -> float:
    """Keep ``in_flight`` 1-call turns going for ``duration`` s; completed calls per second."""
    definition = one_call_agent("noop")
    pending = set(await asyncio.gather(*(world.submit(definition) for _ in range(in_flight))))
    done = 0
    t0 = time.perf_counter()
    stop = t0 + duration
    while time.perf_counter() < stop:
        await asyncio.sleep(0.01)
        statuses = await world.statuses(list(pending))
        finished = [t for t, s in statuses.items() if s in ("completed", "failed", "cancelled")]
        if any(statuses[t] != "completed" for t in finished):
            raise RuntimeError("a throughput turn did not complete")
        done += len(finished)
        pending.difference_update(finished)
        if finished and time.perf_counter() < stop:
            pending.update(await asyncio.gather(*(world.submit(definition) for _ in finished)))
    rate = done / (time.perf_counter() - t0)
    await world.wait_done(list(pending), timeout=120, interval=0.05)  # drain before the next level
    return rate


async def run(ctx: Context) -> Result:
    levels = [1, 10, 50]
    duration = 2.0 if ctx.quick else 10.0
    repeats = 1 if ctx.quick else 3
    results: dict[str, dict[str, list[float]]] = {"Tendon": {}, "floor": {}, "Celery": {}, "DBOS": {}}
    world = TendonWorld(ctx.services, ctx.procs)
    try:
        await world.start_brain()
        await world.start_hands()
        await world.start_hands()
        await world.open()
        await tendon_closed_loop(world, 4, 1.0)  # warm up
        deadlocks = await ctx.services.deadlocks()
        for _ in range(repeats):
            for k in levels:
                await world.settle()  # steady state, as autovacuum keeps it: see bench.harness.settle
                results["Tendon"].setdefault(str(k), []).append(await tendon_closed_loop(world, k, duration))
        await asyncio.sleep(2)  # backends report their counters within a second or two
        deadlocks = await ctx.services.deadlocks() - deadlocks
    finally:
        await world.cleanup()
    async with Floor(ctx.services.database_url, ctx.services.amqp_url) as floor:
        await floor.closed_loop(4, 0.5)
        for _ in range(repeats):
            for k in levels:
                await floor.settle()
                results["floor"].setdefault(str(k), []).append(await floor.closed_loop(k, duration))
    celery_ok = False
    if ctx.quick:
        ctx.notes.append(
            "quick mode: Celery throughput and latency not run (needs the `bench` extra); run without"
            " --quick (its worker-kill recovery trials do run in quick mode when Celery is installed)"
        )
    elif not celery_bench.available():
        ctx.notes.append("Celery is not installed (pip install -e '.[bench]'): its columns are empty")
    else:
        async with celery_bench.CeleryPeer(ctx.services.amqp_url, ctx.procs) as peer:
            await peer.closed_loop(4, 1.0)
            for _ in range(repeats):
                for k in levels:
                    results["Celery"].setdefault(str(k), []).append(await peer.closed_loop(k, duration))
            celery_ok = True
            res_lat = await peer.sequential(ctx.n(10, 200))
    dbos = await dbos_bench.maybe_run(
        ctx,
        "throughput",
        timeout=len(levels) * repeats * (duration + 30) + 120,
        levels=",".join(map(str, levels)),
        duration=duration,
        repeats=repeats,
    )
    if dbos:
        results["DBOS"] = dbos["rates"]
    res = Result()
    for k in levels:
        key = str(k)
        res.rows.append(
            Row(
                "throughput",
                f"tool calls/s, {k} in flight",
                "calls/s",
                median(results["Tendon"][key]),
                median(results["floor"][key]),
                median(results["Celery"][key]) if celery_ok else None,
                median(results["DBOS"][key]) if dbos else None,
                target="not below Celery" if k == 50 else "",
                note=f"median of {repeats} x {duration:.0f} s",
            )
        )
    res.rows.append(
        Row(
            "throughput",
            "PostgreSQL deadlocks during Tendon's levels",
            "count",
            deadlocks,
            note="each one stalls two transactions for deadlock_timeout (1 s) before one is retried",
        )
    )
    if celery_ok:
        res.rows.append(
            Row(
                "latency",
                "1 call p50 (Celery: apply_async to result via rpc://)",
                "ms",
                None,
                None,
                median(res_lat) * 1000,
                note="compare with the client-observed latency row",
            )
        )
    res.series["throughput"] = {name: {k: median(v) for k, v in per.items()} for name, per in results.items()}
    return res
