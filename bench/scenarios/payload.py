"""Payload: tool results of 1 KiB .. 100 MiB through S3 (moto server), submit to completed."""

from __future__ import annotations

from bench.harness import TendonWorld, median, one_call_agent
from bench.scenarios.base import Context, Result, Row

SIZES = {"1 KiB": 1024, "1 MiB": 1024**2, "16 MiB": 16 * 1024**2, "100 MiB": 100 * 1024**2}


async def run(ctx: Context) -> Result:
    sizes = dict(list(SIZES.items())[:2]) if ctx.quick else SIZES
    repeats = ctx.n(1, 3)
    res = Result()
    world = TendonWorld(ctx.services, ctx.procs)
    try:
        await world.start_brain()
        await world.start_hands()
        await world.open()
        for label, size in sizes.items():
            times, error = [], ""
            for _ in range(repeats):
                tid = await world.submit(one_call_agent("blob", size=size))
                try:
                    await world.wait_done([tid], timeout=300, interval=0.02)
                except (RuntimeError, TimeoutError) as exc:
                    error = f"FAILED: {exc}"
                    break
                times.extend(await world.server_latencies([tid]))
            res.rows.append(
                Row(
                    "payload",
                    f"{label} result, submit to completed",
                    "s",
                    median(times) if times else None,
                    target="no failure" if label == "100 MiB" else "",
                    note=error or f"median of {len(times)}",
                )
            )
    finally:
        await world.cleanup()
    if ctx.quick:
        ctx.notes.append("quick mode: payload stops at 1 MiB (100 MiB only in full mode)")
    return res
