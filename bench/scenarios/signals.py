"""Signals: N turns parked on the built-in ``wait_for_signal`` (no Hands pool at all), then a signal
each. What waiting costs the Brain (RSS growth, CPU while waiting, turns that hold a lease: a Brain's
run slot), then how fast the signals wake them: the seconds from the first signal to the last
turn completed (by the database's clock), and the signals' rate."""

from __future__ import annotations

import asyncio
import time

from bench.harness import TendonWorld, agent
from bench.scenarios.base import Context, Result, Row
from bench.scenarios.waiting import park

KEY = "x.bench.go"


async def run(ctx: Context) -> Result:
    from brain.store import wake_channel
    from brain.verbs import signals

    n = ctx.waiting or ctx.n(50, 10_000)
    world = TendonWorld(ctx.services, ctx.procs)
    calls = [{"tool": "wait_for_signal", "args": {"key": KEY}}]
    definition = agent("signalled", [calls], ["wait_for_signal"])
    try:
        brain = await world.start_brain()
        await world.open()
        await asyncio.sleep(0.5)
        waits = "SELECT count(*) AS c FROM executions WHERE how = 'awaiting_signal'"
        parked = await park(ctx, world, brain.pid, definition, n, waits)
        ids, submit_s, rss0, rss1, cpu_idle = (
            parked.ids,
            parked.submit_s,
            parked.rss0,
            parked.rss1,
            parked.cpu_idle,
        )
        leased = (await world.fetch("SELECT count(*) AS c FROM turns WHERE lease_owner IS NOT NULL"))[0]["c"]
        waiting = (await world.fetch("SELECT count(*) AS c FROM turns WHERE status = 'waiting'"))[0]["c"]

        async def send(turn_id: str) -> None:
            await signals.signal(
                world.store, namespace=world.settings.namespace, turn_id=turn_id, request_id="go", key=KEY,
                payload={"n": 1}, wake_channel=wake_channel(world.settings),
            )  # fmt: skip

        opened = (await world.fetch("SELECT now() AS t"))[0]["t"]
        s0 = time.monotonic()
        for i in range(0, n, 50):
            await asyncio.gather(*(send(t) for t in ids[i : i + 50]))
        signal_s = time.monotonic() - s0
        await world.wait_done(ids, timeout=60 if ctx.quick else 3600, interval=0.5)
        last = (await world.fetch("SELECT max(updated_at) AS t FROM turns WHERE id = ANY($1)", ids))[0]["t"]
        drain = (last - opened).total_seconds()
    finally:
        await world.cleanup()
    return Result(
        rows=[
            Row("signals", f"{n} turns waiting on a signal: Brain RSS growth", "MB", rss1 - rss0,
                note=f"RSS {rss0:.0f} -> {rss1:.0f} MB; submitted in {submit_s:.1f} s; no Hands pool"),
            Row("signals", f"{n} turns waiting on a signal: Brain CPU while waiting", "% of a core",
                cpu_idle),
            Row("signals", f"{n} turns waiting on a signal: turns holding a lease (a run slot)", "turns",
                leased, note=f"{waiting} turns waiting"),
            Row("signals", f"{n} turns waiting on a signal: signal to all completed", "s", drain,
                note=f"{n / drain:.0f} turns/s; the signals sent in {signal_s:.1f} s, 50 at a time"),
        ]
    )  # fmt: skip
