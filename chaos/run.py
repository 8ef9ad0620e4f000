"""One chaos run: a workload of agent turns kept in flight while faults are injected, then
every turn driven to its end, UNKNOWNs reconciled from the counting service's truth, and the
verdicts (lost turns, blind re-sends, UNKNOWNs and whether each was really unknown)."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench.harness import TendonWorld, agent
from chaos.faults import Fault, Injected, Tally, plan, tally
from chaos.topology import Deployment

TOOLS = ("touch", "send", "send_blind")
TERMINAL = ("completed", "failed", "cancelled")
RECOVERY_WAIT = 60.0  # longest wait for progress after a fault, before the next one


@dataclass
class Shape:
    faults: int
    kinds: tuple[Fault, ...]
    seed: int = 1
    brains: int = 2
    hands: int = 3
    in_flight: int = 8
    hold: float = 0.4  # seconds each tool waits before and after its call
    spacing: float = 1.0  # seconds of plain work between two faults
    settle: float = 240.0  # how long the turns may take to end once the faults stop


@dataclass
class Outcome:
    shape: Shape
    injected: list[Injected] = field(default_factory=list)
    turns: dict[str, str] = field(default_factory=dict)  # turn -> final status
    failures: dict[str, str] = field(default_factory=dict)  # failed turn -> its error
    unknown: dict[str, str] = field(default_factory=dict)  # execution -> its tool
    reconciled: dict[str, str] = field(default_factory=dict)  # execution -> succeeded / failed
    tally: Tally = field(default_factory=Tally)
    restarts: int = 0
    seconds: float = 0.0

    @property
    def lost(self) -> list[str]:
        return [t for t, s in self.turns.items() if s not in TERMINAL]

    @property
    def unexpected_unknown(self) -> list[str]:
        """UNKNOWNs of a tool that could have been settled (re-run, or asked)."""
        return [e for e, tool in self.unknown.items() if tool != "send_blind"]


class Workload:
    """Keeps ``in_flight`` turns going (tools in turn) and notes when each ends."""

    def __init__(self, world: TendonWorld, shape: Shape) -> None:
        self.world = world
        self.shape = shape
        calls = {t: [[{"tool": t, "args": {"hold": shape.hold}}]] for t in TOOLS}
        self.agents = {t: agent(f"chaos-{t}", calls[t], [t]) for t in TOOLS}
        self.status: dict[str, str] = {}
        self.ended_at: dict[str, float] = {}
        self.open = True

    async def held_by_unknown(self) -> set[str]:
        rows = await self.world.fetch("SELECT DISTINCT turn_id FROM executions WHERE status = 'unknown'")
        return {r["turn_id"] for r in rows}

    def active(self) -> set[str]:
        return {t for t, s in self.status.items() if s not in TERMINAL}

    async def run(self) -> None:
        n = 0
        while True:
            while self.open and len(self.active()) < self.shape.in_flight:
                turn = await self.world.submit(self.agents[TOOLS[n % len(TOOLS)]])
                self.status[turn] = "queued"
                n += 1
            active = list(self.active())
            if active:
                now = time.monotonic()
                for turn, status in (await self.world.statuses(active)).items():
                    self.status[turn] = status
                    if status in TERMINAL:
                        self.ended_at[turn] = now
            await asyncio.sleep(0.05)


async def run(world: TendonWorld, shape: Shape, say: Any = print) -> Outcome:
    out = Outcome(shape)
    rng = random.Random(shape.seed)
    deployment = Deployment(world, shape.brains, shape.hands)
    t0 = time.monotonic()
    await deployment.start()
    work = Workload(world, shape)
    driver = asyncio.create_task(work.run())
    try:
        for i, fault in enumerate(plan(shape.seed, shape.faults, shape.kinds), 1):
            await asyncio.sleep(shape.spacing)
            if driver.done():
                driver.result()  # the workload itself failed: say why
            before = work.active()
            hit = await deployment.inject(fault, rng, time.monotonic)
            await _progress(work, before, hit)
            out.injected.append(hit)
            rec = "none within 60 s" if hit.recovery is None else f"{hit.recovery:.2f} s"
            say(f"[chaos] {i}/{shape.faults} {fault.value} {hit.target}: every turn in flight ended in {rec}")
        work.open = False
        await _settle(world, deployment, work, out, say)
    finally:
        driver.cancel()
        await asyncio.gather(driver, return_exceptions=True)
        out.restarts = sum(s.restarts for s in deployment.slots)
        posts = await deployment.posts()
        await deployment.close()
    tools = {r["id"]: r["tool"] for r in await world.fetch("SELECT id, tool FROM executions")}
    out.tally = tally(posts, tools)
    out.turns = dict(work.status)
    failed = [t for t, s in out.turns.items() if s == "failed"]
    for r in await world.fetch("SELECT id, error FROM turns WHERE id = ANY($1::text[])", failed):
        out.failures[r["id"]] = str(r["error"])
    out.seconds = time.monotonic() - t0
    return out


async def _progress(work: Workload, before: set[str], hit: Injected) -> None:
    """Note when the first and the last turn that were in flight at the fault ended after it
    was lifted (turns held by an UNKNOWN execution wait for a person: they do not count)."""
    deadline = time.monotonic() + RECOVERY_WAIT
    while time.monotonic() < deadline:
        ended = [work.ended_at[t] for t in before if t in work.ended_at]
        after = [t for t in ended if t >= hit.lifted]
        if after and hit.first is None:
            hit.first = min(after)
        held = await work.held_by_unknown()
        if all(t in work.ended_at or t in held for t in before):
            hit.recovered = max([hit.lifted, *ended])
            hit.first = hit.first if hit.first is not None else hit.recovered
            return
        await asyncio.sleep(0.1)


async def _settle(world: TendonWorld, deployment: Deployment, work: Workload, out: Outcome, say: Any) -> None:
    """Let every turn end; reconcile the UNKNOWNs by what the blind mailbox saw, as an operator
    with the provider's records would."""
    deadline = time.monotonic() + out.shape.settle
    while work.active() and time.monotonic() < deadline:
        for r in await world.fetch(
            "SELECT id, tool FROM executions WHERE status = 'unknown' AND NOT (id = ANY($1::text[]))",
            list(out.unknown),
        ):
            out.unknown[r["id"]] = r["tool"]
            await _reconcile(world, deployment, r["id"], out, say)
        await asyncio.sleep(0.5)


async def _reconcile(
    world: TendonWorld, deployment: Deployment, execution_id: str, out: Outcome, say: Any
) -> None:
    happened = (await deployment.posts()).get(execution_id, 0) > 0
    seen = json.dumps({"receipt": "seen by the provider"})
    outcome = ["--result", seen] if happened else ["--failed", "not sent"]
    args = [sys.executable, "-m", "hands", "reconcile", execution_id, *outcome,
            "--evidence", "the blind mailbox's own count of posts", "--actor", "chaos"]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *args, env={**world.env}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    text, _ = await proc.communicate()
    out.reconciled[execution_id] = "succeeded" if happened else "failed"
    if proc.returncode != 0:
        say(f"[chaos] reconcile of {execution_id} failed: {text.decode(errors='replace').strip()}")
