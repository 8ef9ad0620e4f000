"""One chaos run: a workload of agent turns kept in flight while faults are injected, an
operator who reconciles each UNKNOWN from the counting service's truth as it comes, every turn
driven to its end, and the verdicts (lost turns, blind re-sends, UNKNOWNs and whether each was
really unknown).

What the run drives is a :class:`Target`: a deployment it starts itself on the local services
(``chaos.topology.Deployment``), or a compose project that runs already (``chaos.compose``). The
workload, the faults' plan, the recovery measures and the verdicts are the same for both.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, TypeVar

from chaos.faults import Fault, Injected, Tally, plan, tally
from infra.db import is_transient

T = TypeVar("T")
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


class Target(Protocol):
    """What a run drives: turns submitted and looked at, UNKNOWNs reconciled, faults injected."""

    tools: tuple[str, ...]  # the tools the workload's turns call, one a turn, in turn
    blind: frozenset[str]  # tools that cannot be asked: an UNKNOWN of one is expected
    safe: frozenset[str]  # tools whose re-run is allowed
    look_every: float  # seconds between two looks at the turns in flight

    def describe(self, shape: Shape) -> str:
        """What was run, for the report (a sentence)."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    @property
    def restarts(self) -> int:
        """Processes restarted after they exited, as a restart policy does."""
        ...

    async def submit(self, n: int, tool: str) -> str:
        """Turn ``n`` (one call of ``tool``); the same ``n`` is the same turn. Its id."""
        ...

    async def statuses(self, turns: list[str]) -> dict[str, str]: ...

    async def unknown(self, turns: list[str]) -> list[tuple[str, str, str]]:
        """The UNKNOWN executions of ``turns``: (execution, tool, turn)."""
        ...

    async def reconcile(self, execution_id: str, happened: bool) -> str | None:
        """Settle an UNKNOWN execution as an operator would; what went wrong, if anything."""
        ...

    async def executions(self, turns: list[str]) -> dict[str, str]:
        """Every execution of ``turns``, with its tool."""
        ...

    async def errors(self, turns: list[str]) -> dict[str, str]: ...

    async def posts(self) -> dict[str, int]:
        """What the counting service saw: POSTs per operation id."""
        ...

    async def inject(self, fault: Fault, rng: random.Random, clock: Callable[[], float]) -> Injected: ...


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
    blind: frozenset[str] = frozenset({"send_blind"})  # the tools that may go UNKNOWN
    deployment: str = ""  # what was run (``Target.describe``)
    command: str = ""  # how the run was asked for

    @property
    def lost(self) -> list[str]:
        return [t for t, s in self.turns.items() if s not in TERMINAL]

    @property
    def unexpected_unknown(self) -> list[str]:
        """UNKNOWNs of a tool that could have been settled (re-run, or asked)."""
        return [e for e, tool in self.unknown.items() if tool not in self.blind]


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

    def __init__(self, target: Target, shape: Shape) -> None:
        self.target = target
        self.shape = shape
        self.status: dict[str, str] = {}
        self.ended_at: dict[str, float] = {}
        self.open = True

    async def held_by_unknown(self, turns: set[str]) -> set[str]:
        return {turn for _, _, turn in await patiently(partial(self.target.unknown, sorted(turns)))}

    def active(self) -> set[str]:
        return {t for t, s in self.status.items() if s not in TERMINAL}

    async def run(self) -> None:
        n = 0
        tools = self.target.tools
        while True:
            while self.open and len(self.active()) < self.shape.in_flight:
                # Its number makes a submit tried again after a lost answer the same turn.
                turn = await patiently(partial(self.target.submit, n, tools[n % len(tools)]))
                self.status[turn] = "queued"
                n += 1
            active = list(self.active())
            if active:
                statuses = await patiently(partial(self.target.statuses, active))
                now = time.monotonic()
                for turn, status in statuses.items():
                    self.status[turn] = status
                    if status in TERMINAL:
                        self.ended_at[turn] = now
            await asyncio.sleep(self.target.look_every)


async def run(target: Target, shape: Shape, say: Any = print) -> Outcome:
    out = Outcome(shape, blind=target.blind)
    rng = random.Random(shape.seed)
    t0 = time.monotonic()
    await target.start()
    out.deployment = target.describe(shape)
    work = Workload(target, shape)
    tasks = [asyncio.create_task(work.run()), asyncio.create_task(_operate(target, work, out, say))]
    try:
        for i, fault in enumerate(plan(shape.seed, shape.faults, shape.kinds), 1):
            await asyncio.sleep(shape.spacing)
            _check(tasks)
            before = work.active()
            hit = await target.inject(fault, rng, time.monotonic)
            before |= work.active()  # and what came in while it lasted (a service down, say)
            await _progress(work, before, hit)
            out.injected.append(hit)
            rec = "none within 60 s" if hit.recovery is None else f"{hit.recovery:.2f} s"
            say(f"[chaos] {i}/{shape.faults} {fault.value} {hit.target}: every turn in flight ended in {rec}")
        work.open = False
        await _settle(work, tasks, shape.settle)
        out.turns = dict(work.status)
        turns = sorted(out.turns)
        tools = await patiently(partial(target.executions, turns))
        out.tally = tally(await target.posts(), tools, safe=target.safe)
        failed = [t for t in turns if out.turns[t] == "failed"]
        out.failures = await patiently(partial(target.errors, failed))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await target.close()
        out.restarts = target.restarts
    out.seconds = time.monotonic() - t0
    return out


async def _progress(work: Workload, before: set[str], hit: Injected) -> None:
    """Note when the first and the last turn that were in flight at the fault ended after it
    was lifted (turns held by an UNKNOWN execution wait for a person: they do not count)."""
    deadline = time.monotonic() + RECOVERY_WAIT
    asked = 0.0  # when the UNKNOWNs were last looked at: once a second is enough
    while time.monotonic() < deadline:
        ended = [work.ended_at[t] for t in before if t in work.ended_at]
        after = [t for t in ended if t >= hit.lifted]
        if after and hit.first is None:
            hit.first = min(after)
        waiting = {t for t in before if t not in work.ended_at}
        if waiting and time.monotonic() - asked >= 1.0:
            asked = time.monotonic()
            waiting -= await work.held_by_unknown(waiting)
        if not waiting:
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


async def _operate(target: Target, work: Workload, out: Outcome, say: Any) -> None:
    """What an operator does, all along: reconcile each UNKNOWN execution by what the counting
    service saw (the provider's own records), so that its turn goes on."""
    while True:
        active = sorted(work.active())
        for execution_id, tool, _ in await patiently(partial(target.unknown, active)) if active else []:
            if execution_id in out.unknown:
                continue
            out.unknown[execution_id] = tool
            happened = (await target.posts()).get(execution_id, 0) > 0
            out.reconciled[execution_id] = "succeeded" if happened else "failed"
            problem = await target.reconcile(execution_id, happened)
            if problem:
                say(f"[chaos] reconcile of {execution_id} failed: {problem}")
        await asyncio.sleep(1.0)
