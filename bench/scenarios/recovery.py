"""Recovery: SIGKILL a Hands worker inside a tool body, and a Brain mid-turn with a standby.

Hands (default settings otherwise): two Hands processes; the one running the tool is killed.
*safe*: seconds from SIGKILL until the tool body starts again (in the survivor).
*unsafe* (no query): seconds from SIGKILL until the Brain shows the execution UNKNOWN.
Brain: a turn waits on a tool; a standby Brain is up; the owning Brain is SIGKILLed at the
moment the tool's answer is released; seconds from SIGKILL until the turn is completed.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

from bench.harness import TendonWorld, median, one_call_agent, pct, wait_for
from bench.scenarios.base import Context, Result, Row


def _starts(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [int(line.split()[0]) for line in path.read_text().splitlines() if line.strip()]


async def hands_trial(world: TendonWorld, safe: bool, workers: list, timeout: float) -> float:
    gate = uuid.uuid4().hex[:8]
    tool = "sleepy_safe" if safe else "sleepy_unsafe"
    tid = await world.submit(one_call_agent(tool, gate=gate))
    started = world.gate(f"{gate}.started")

    async def first() -> list[int]:
        return _starts(started)

    pid = (await wait_for(first, timeout=timeout, what="tool body start"))[0]
    victim = next(p for p in workers if p.pid == pid)
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    victim.wait(timeout=10)
    workers.remove(victim)
    if safe:

        async def rerun() -> bool:
            return len(_starts(started)) >= 2

        await wait_for(rerun, timeout=timeout, interval=0.01, what="re-run")
    else:

        async def unknown() -> bool:
            rows = await world.fetch("SELECT status FROM executions WHERE turn_id = $1", tid)
            return bool(rows) and rows[0]["status"] == "unknown"

        await wait_for(unknown, timeout=timeout, interval=0.01, what="UNKNOWN")
    took = time.monotonic() - t0
    world.gate(gate).touch()
    workers.append(await world.start_hands())
    return took


async def brain_trial(world: TendonWorld, brains: list, timeout: float) -> float:
    gate = uuid.uuid4().hex[:8]
    tid = await world.submit(one_call_agent("sleepy_safe", gate=gate))

    async def waiting() -> bool:
        return (await world.statuses([tid])).get(tid) == "waiting"

    await wait_for(waiting, timeout=timeout, what="turn waiting")
    owner = brains.pop(0)  # the oldest Brain: the standby was started after this turn was claimed
    brains.append(await world.start_brain())  # the standby
    owner.send_signal(signal.SIGKILL)
    t0 = time.monotonic()
    world.gate(gate).touch()
    owner.wait(timeout=10)
    await world.wait_done([tid], timeout=timeout, interval=0.01)
    return time.monotonic() - t0


async def run(ctx: Context) -> Result:
    trials = ctx.n(2, 20)
    timeout = 90.0
    series: dict[str, list[float]] = {
        "Hands kill, safe: re-run": [],
        "Hands kill, unsafe: UNKNOWN": [],
        "Brain kill: standby completes": [],
    }
    world = TendonWorld(ctx.services, ctx.procs)
    try:
        brains = [await world.start_brain()]
        workers = [await world.start_hands(), await world.start_hands()]
        await world.open()
        for _ in range(trials):
            series["Hands kill, safe: re-run"].append(await hands_trial(world, True, workers, timeout))
            series["Hands kill, unsafe: UNKNOWN"].append(await hands_trial(world, False, workers, timeout))
        for _ in range(trials):
            series["Brain kill: standby completes"].append(await brain_trial(world, brains, timeout))
    finally:
        await world.cleanup()
    targets = {
        "Hands kill, safe: re-run": "p50 <= 1 s",
        "Hands kill, unsafe: UNKNOWN": "p50 <= 1 s",
        "Brain kill: standby completes": "p50 <= 2 s",
    }
    res = Result(series={"recovery": series})
    for name, xs in series.items():
        for q in (50, 95):
            res.rows.append(
                Row(
                    "recovery",
                    f"{name} p{q}",
                    "s",
                    pct(xs, q),
                    target=targets[name] if q == 50 else "",
                    note=f"{len(xs)} trials",
                )
            )
    ctx.notes.append(f"recovery: medians {', '.join(f'{k} {median(v):.2f}s' for k, v in series.items())}")
    return res
