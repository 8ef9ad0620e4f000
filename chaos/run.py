"""One chaos run: a workload of agent turns kept in flight while faults are injected, an
operator who reconciles each UNKNOWN from the counting service's truth as it comes, every turn
driven to its end, and the verdicts (lost turns, blind re-sends, UNKNOWNs and whether each was
really unknown)."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from bench.harness import TendonWorld, agent
from brain import verbs
from brain.rules.agents import AgentDefinition
from brain.store import wake_channel
from chaos.faults import Fault, Injected, Tally, plan, tally
from chaos.topology import Deployment
from infra.db import is_transient

T = TypeVar("T")
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


async def patiently(work: Callable[[], Awaitable[T]], limit: float = 120.0) -> T:
    """``work()``, tried again while the services it reads are away (the run restarts them)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            return await work()
        except Exception as exc:
            if not is_transient(exc) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.25)


class Workload:
    """Keeps ``in_flight`` turns going (tools in turn) and notes when each ends."""

    def __init__(self, world: TendonWorld, shape: Shape) -> None:
        self.world = world
        self.shape = shape
        calls = {t: [[{"tool": t, "args": {"hold": shape.hold}}]] for t in TOOLS}
        self.agents = {t: AgentDefinition.model_validate(agent(f"chaos-{t}", calls[t], [t])) for t in TOOLS}
        self.status: dict[str, str] = {}
        self.ended_at: dict[str, float] = {}
        self.open = True

    async def submit(self, n: int) -> str:
        """Turn ``n``; its request id makes a submit tried again after a lost answer the same turn."""
        s = self.world.settings
        turn_id, _ = await patiently(
            lambda: verbs.submit(
                self.world.store,
                namespace=s.namespace,
                session_id=f"chaos-{n}",
                request_id=f"chaos-{n}",
                user_input="go",
                agent=self.agents[TOOLS[n % len(TOOLS)]],
                wake_channel=wake_channel(s),
            )  # fmt: skip
        )
        return str(turn_id)

    async def held_by_unknown(self) -> set[str]:
        rows = await patiently(
            lambda: self.world.fetch("SELECT DISTINCT turn_id FROM executions WHERE status = 'unknown'")
        )
        return {r["turn_id"] for r in rows}

    def active(self) -> set[str]:
        return {t for t, s in self.status.items() if s not in TERMINAL}

    async def run(self) -> None:
        n = 0
        while True:
            while self.open and len(self.active()) < self.shape.in_flight:
                self.status[await self.submit(n)] = "queued"
                n += 1
            active = list(self.active())
            if active:
                statuses = await patiently(partial(self.world.statuses, active))
                now = time.monotonic()
                for turn, status in statuses.items():
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
    tasks = [asyncio.create_task(work.run()), asyncio.create_task(_operate(world, deployment, out, say))]
    try:
        for i, fault in enumerate(plan(shape.seed, shape.faults, shape.kinds), 1):
            await asyncio.sleep(shape.spacing)
            _check(tasks)
            before = work.active()
            hit = await deployment.inject(fault, rng, time.monotonic)
            before |= work.active()  # and what came in while it lasted (a service down, say)
            await _progress(work, before, hit)
            out.injected.append(hit)
            rec = "none within 60 s" if hit.recovery is None else f"{hit.recovery:.2f} s"
            say(f"[chaos] {i}/{shape.faults} {fault.value} {hit.target}: every turn in flight ended in {rec}")
        work.open = False
        await _settle(work, tasks, shape.settle)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        out.restarts = sum(s.restarts for s in deployment.slots)
        posts = await deployment.posts()
        await deployment.close()
    tools = {
        r["id"]: r["tool"] for r in await patiently(lambda: world.fetch("SELECT id, tool FROM executions"))
    }
    out.tally = tally(posts, tools)
    out.turns = dict(work.status)
    failed = [t for t, s in out.turns.items() if s == "failed"]
    errors = await patiently(
        lambda: world.fetch("SELECT id, error FROM turns WHERE id = ANY($1::text[])", failed)
    )
    for r in errors:
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


async def _settle(work: Workload, tasks: list[asyncio.Task[None]], limit: float) -> None:
    """Let every turn end (the operator reconciles the UNKNOWNs meanwhile)."""
    deadline = time.monotonic() + limit
    while work.active() and time.monotonic() < deadline:
        _check(tasks)
        await asyncio.sleep(0.5)


def _check(tasks: list[asyncio.Task[None]]) -> None:
    """Raise what ended the workload or the operator, if one ended (neither ends on its own)."""
    for task in tasks:
        if task.done():
            task.result()


async def _operate(world: TendonWorld, deployment: Deployment, out: Outcome, say: Any) -> None:
    """What an operator does, all along: reconcile each UNKNOWN execution by what the blind
    mailbox saw (the provider's own records), so that its turn goes on."""
    while True:
        unknown = await patiently(
            lambda: world.fetch(
                "SELECT id, tool FROM executions WHERE status = 'unknown' AND NOT (id = ANY($1::text[]))",
                list(out.unknown),
            )
        )
        for r in unknown:
            out.unknown[r["id"]] = r["tool"]
            await _reconcile(world, deployment, r["id"], out, say)
        await asyncio.sleep(1.0)


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
