"""Waiting: N turns parked on a tool that has not answered; Brain RSS/CPU, then drain time.

The tool (``wait_gate``) answers once a gate file exists. Brain RSS and CPU time come from
/proc/<pid>. Drain: seconds from opening the gate until every turn is completed, by the
database's clock (Hands pool of 2 at default concurrency, so it includes running the N tool
bodies), and the CPU the drain cost per turn in every process, by role (``bench.cpu``): the drain
is bound by the two cores, so that is where its time goes.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.cpu import CpuMeter, per_call
from bench.harness import TendonWorld, one_call_agent
from bench.scenarios.base import Context, Result, Row


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime in clock ticks (100 Hz)


@dataclass
class Parked:
    """Turns submitted and waiting, and what their waiting cost the Brain."""

    ids: list[str]
    submit_s: float  # seconds to submit them all
    rss0: float  # the Brain's RSS before (MB)
    rss1: float  # and once all of them waited
    cpu_idle: float  # the Brain's CPU while they waited (% of a core)


async def park(
    ctx: Context, world: TendonWorld, brain_pid: int, definition: dict[str, Any], n: int, waiting_sql: str
) -> Parked:
    """Submit ``n`` turns of ``definition``, 50 at a time, wait until ``waiting_sql`` counts them
    all, then read the Brain's RSS and its CPU over a quiet stretch."""
    rss0 = rss_mb(brain_pid)
    ids: list[str] = []
    t0 = time.monotonic()
    for i in range(0, n, 50):
        ids += await asyncio.gather(*(world.submit(definition) for _ in range(min(50, n - i))))
    submit_s = time.monotonic() - t0
    deadline = time.monotonic() + (60 if ctx.quick else 1200)
    while (await world.fetch(waiting_sql))[0]["c"] < n:
        if time.monotonic() > deadline:
            raise TimeoutError("the turns did not all reach their wait")
        await asyncio.sleep(0.5)
    cpu0, w0 = cpu_seconds(brain_pid), time.monotonic()
    await asyncio.sleep(2 if ctx.quick else 20)
    cpu_idle = (cpu_seconds(brain_pid) - cpu0) / (time.monotonic() - w0) * 100
    return Parked(ids, submit_s, rss0, rss_mb(brain_pid), cpu_idle)


async def run(ctx: Context) -> Result:
    n = ctx.waiting or ctx.n(50, 10_000)
    world = TendonWorld(ctx.services, ctx.procs)
    gate = uuid.uuid4().hex[:8]
    definition = one_call_agent("wait_gate", gate=gate)
    try:
        brain = await world.start_brain()
        await world.start_hands()
        await world.start_hands()
        await world.open()
        await asyncio.sleep(0.5)
        parked = await park(
            ctx, world, brain.pid, definition, n, "SELECT count(*) AS c FROM turns WHERE status = 'waiting'"
        )
        ids, submit_s, rss0, rss1, cpu_idle = (
            parked.ids,
            parked.submit_s,
            parked.rss0,
            parked.rss1,
            parked.cpu_idle,
        )
        meter = CpuMeter(world.roles)
        before = meter.read()
        opened = (await world.fetch("SELECT now() AS t"))[0]["t"]
        world.gate(gate).touch()
        await world.wait_done(ids, timeout=60 if ctx.quick else 3600, interval=0.5)
        cpu = per_call(before, meter.read(), n)  # the harness's share is its status polls
        # From the database's clock before the gate opened to the last completing commit: the
        # poll above only says when to look (it would add up to its interval).
        last = (await world.fetch("SELECT max(updated_at) AS t FROM turns WHERE id = ANY($1)", ids))[0]["t"]
        drain = (last - opened).total_seconds()
    finally:
        await world.cleanup()
    return Result(
        rows=[
            Row(
                "waiting",
                f"{n} waiting turns: Brain RSS growth",
                "MB",
                rss1 - rss0,
                target="< 100 MB at 100,000",
                note=f"RSS {rss0:.0f} -> {rss1:.0f} MB; submitted in {submit_s:.1f} s",
            ),
            Row("waiting", f"{n} waiting turns: Brain CPU while waiting", "% of a core", cpu_idle),
            Row(
                "waiting",
                f"{n} waiting turns: drain after the answers come",
                "s",
                drain,
                note=f"{n / drain:.0f} turns/s",
            ),
            Row(
                "waiting",
                f"{n} waiting turns: CPU per turn drained, all processes",
                "ms",
                sum(cpu.values()),
                note=", ".join(f"{role} {ms:.2f}" for role, ms in cpu.items()),
            ),
        ]
    )
