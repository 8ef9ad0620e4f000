"""Throughput: tool calls per second with 1, 10 and 50 in flight (closed loop), and the CPU
time one call costs in every process that takes part.

Tendon: one Brain, a Hands pool of 2 processes; each in-flight unit is a 1-call turn (so a
Tendon "call" here also carries its turn: submit, two scripted model steps, finalize). The
harness keeps K turns in flight and resubmits as it sees completions (polled every 10 ms).
A second shape keeps 50 calls in flight as 5 turns of 10 calls in one model step: what a call
costs when the turn around it is shared. Floor, Celery and DBOS (full mode) run the same
closed loop with K calls / tasks / one-step workflows in flight; and, like for like with a
1-call turn (model step, tool call, model step), Celery chains of 3 tasks and DBOS workflows
of 3 steps, each shape taking turns with the single-task one level by level.

At 50 in flight the machine is saturated, so calls per second is about the machine's two
cores divided by the CPU time per call; ``bench.cpu`` splits that time by process role.

A Tendon level's measuring window lasts ``duration`` seconds and, if that is not enough, until
as many calls as it keeps in flight have completed in it (one round of the loop; a window that
does not see it within ``WINDOW_TIMEOUT`` s raises). Calls per second is the calls completed in
the window over its length, and CPU per call the CPU time of the window over those calls, as
before. The rule is new: in quick mode (2 s) on a loaded machine, the 50 turns of a level,
which move through their steps together, could all still be running when the window closed, so
the level had a rate of 0 and no CPU split (and its CPU rows vanished from the table), or the
window caught one 10-call turn of the five, a fifth of the rate and five times the CPU per call.
The floor's and the peers' loops need no such rule: each in-flight slot starts a call at once
and the loop waits for every slot's last call, so each slot completes at least one. A window
that ran past ``duration`` is named in the run's notes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from bench.cpu import HARNESS, CpuMeter, per_call
from bench.floor import Floor
from bench.harness import TendonWorld, median, one_call_agent, parallel_agent
from bench.peers import celery_bench, dbos_bench
from bench.peers.celery_bench import CHAIN_NAME
from bench.peers.dbos_bench import THREE_NAME
from bench.scenarios.base import Context, Result, Row

LEVELS = [1, 10, 50]
TARGET_LEVEL = 50
WIDE = 10  # calls per turn in the shared-turn shape
WIDE_NAME = f"Tendon, turns of {WIDE}"
WINDOW_TIMEOUT = 120.0  # s: a Tendon window that has not seen its round of calls by then raises
LIKE = "like for like (Celery: chain of 3 tasks; DBOS: workflow of 3 steps)"


@dataclass
class Level:
    """One closed-loop run: calls per second, CPU ms per call by role (if metered), and the
    length of the measuring window in seconds."""

    rate: float
    cpu: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


class Turns(Protocol):
    """What a Tendon closed loop needs of its world (``bench.harness.TendonWorld``)."""

    async def submit(self, definition: dict[str, Any]) -> str: ...

    async def statuses(self, ids: list[str]) -> dict[str, str]: ...

    async def wait_done(self, ids: list[str], timeout: float, interval: float = ...) -> None: ...


async def tendon_closed_loop(
    world: Turns,
    in_flight: int,
    duration: float,
    *,
    calls_per_turn: int = 1,
    meter: CpuMeter | None = None,
    timeout: float = WINDOW_TIMEOUT,
) -> Level:
    """Keep ``in_flight`` tool calls going, as turns of ``calls_per_turn`` calls in one model
    step, for ``duration`` s and until ``in_flight`` calls have completed (see the module
    docstring); completed calls per second (and CPU per call, with ``meter``, over the same
    window: the drain after it is not counted).

    Raises ``TimeoutError`` if the window has not seen ``in_flight`` calls complete within
    ``timeout`` s, and ``RuntimeError`` if a turn ends other than completed.
    """
    definition = one_call_agent("noop") if calls_per_turn == 1 else parallel_agent(calls_per_turn)
    turns_in_flight = max(1, in_flight // calls_per_turn)
    pending = set(await asyncio.gather(*(world.submit(definition) for _ in range(turns_in_flight))))
    done = 0
    before = meter.read() if meter else {}
    t0 = time.perf_counter()
    stop, deadline = t0 + duration, t0 + max(duration, timeout)
    while True:
        await asyncio.sleep(0.01)
        statuses = await world.statuses(list(pending))
        finished = [t for t, s in statuses.items() if s in ("completed", "failed", "cancelled")]
        if any(statuses[t] != "completed" for t in finished):
            raise RuntimeError("a throughput turn did not complete")
        done += len(finished)
        pending.difference_update(finished)
        now = time.perf_counter()
        if now >= stop and done * calls_per_turn >= in_flight:
            break
        if now >= deadline:
            raise TimeoutError(
                f"throughput window at {in_flight} in flight: {done * calls_per_turn} of the "
                f"{in_flight} calls it waits for completed in {now - t0:.0f} s (the Brain or Hands "
                "logs may say why)"
            )
        if finished:
            pending.update(await asyncio.gather(*(world.submit(definition) for _ in finished)))
    calls = done * calls_per_turn
    seconds = time.perf_counter() - t0
    level = Level(calls / seconds, seconds=seconds)
    if meter:
        level.cpu = per_call(before, meter.read(), calls)
    await world.wait_done(list(pending), timeout=120, interval=0.05)  # drain before the next level
    return level


async def metered(meter: CpuMeter, run: Callable[[], Awaitable[float]]) -> Level:
    """Run a closed loop that returns calls per second; CPU per call over the whole run."""
    before, t0 = meter.read(), time.perf_counter()
    rate = await run()
    seconds = time.perf_counter() - t0
    return Level(rate, per_call(before, meter.read(), rate * seconds), seconds)


def median_cpu(levels: list[Level]) -> dict[str, float]:
    """Per role, the median over the repeats that measured it of CPU ms per call."""
    roles = sorted({role for lv in levels for role in lv.cpu})
    return {role: median([lv.cpu[role] for lv in levels if role in lv.cpu]) for role in roles}


async def run(ctx: Context) -> Result:
    duration = 2.0 if ctx.quick else 10.0
    repeats = 1 if ctx.quick else 3
    rates: dict[str, dict[str, list[float]]] = {
        name: {} for name in ("Tendon", "floor", "Celery", CHAIN_NAME, "DBOS", THREE_NAME)
    }
    at_target: dict[str, list[Level]] = {
        name: [] for name in ("Tendon", WIDE_NAME, "floor", "Celery", CHAIN_NAME)
    }
    world = TendonWorld(ctx.services, ctx.procs)
    try:
        await world.start_brain()
        await world.start_hands()
        await world.start_hands()
        await world.open()
        meter = CpuMeter(world.roles)
        await tendon_closed_loop(world, 4, 1.0)  # warm up
        deadlocks = await ctx.services.deadlocks()
        windows: list[tuple[str, float]] = []  # (shape, seconds) of every Tendon window
        for _ in range(repeats):
            for k in LEVELS:
                await world.settle()  # steady state, as autovacuum keeps it: see bench.harness.settle
                level = await tendon_closed_loop(world, k, duration, meter=meter)
                rates["Tendon"].setdefault(str(k), []).append(level.rate)
                windows.append((f"{k} in flight", level.seconds))
                if k == TARGET_LEVEL:
                    at_target["Tendon"].append(level)
            await world.settle()
            wide = await tendon_closed_loop(world, TARGET_LEVEL, duration, calls_per_turn=WIDE, meter=meter)
            at_target[WIDE_NAME].append(wide)
            windows.append((f"{TARGET_LEVEL} in flight as turns of {WIDE}", wide.seconds))
        long = [f"{shape} {seconds:.1f} s" for shape, seconds in windows if seconds > duration + 0.5]
        if long:
            ctx.notes.append(
                f"throughput: Tendon windows that ran past {duration:.0f} s until the calls they keep "
                f"in flight had completed (a slow or busy machine): {', '.join(long)}"
            )
        await asyncio.sleep(2)  # backends report their counters within a second or two
        deadlocks = await ctx.services.deadlocks() - deadlocks
    finally:
        await world.cleanup()
    meter = CpuMeter()
    async with Floor(ctx.services.database_url, ctx.services.amqp_url) as floor:
        await floor.closed_loop(4, 0.5)
        for _ in range(repeats):
            for k in LEVELS:
                await floor.settle()
                level = await metered(meter, lambda k=k: floor.closed_loop(k, duration))  # type: ignore[misc]
                rates["floor"].setdefault(str(k), []).append(level.rate)
                if k == TARGET_LEVEL:
                    at_target["floor"].append(level)
    celery_ok = False
    if not celery_bench.skipped(ctx):
        async with celery_bench.CeleryPeer(ctx.services.amqp_url, ctx.procs) as peer:
            celery_meter = CpuMeter(
                lambda: {"Celery worker": [p.pid for p in peer.workers if p.poll() is None]}
            )
            await peer.closed_loop(4, 1.0)
            await peer.closed_loop(4, 1.0, chain=True)
            for _ in range(repeats):
                for k in LEVELS:
                    for name, chain in (("Celery", False), (CHAIN_NAME, True)):
                        level = await metered(
                            celery_meter,
                            lambda k=k, chain=chain: peer.closed_loop(k, duration, chain=chain),  # type: ignore[misc]
                        )
                        rates[name].setdefault(str(k), []).append(level.rate)
                        if k == TARGET_LEVEL:
                            at_target[name].append(level)
            celery_ok = True
            res_lat = await peer.sequential(ctx.n(10, 200))
    dbos = await dbos_bench.maybe_run(
        ctx,
        "throughput",
        timeout=len(dbos_bench.SHAPES) * len(LEVELS) * repeats * (duration + 30) + 120,
        levels=",".join(map(str, LEVELS)),
        duration=duration,
        repeats=repeats,
    )
    if dbos:
        rates["DBOS"], rates[THREE_NAME] = dbos["rates"], dbos["rates_3"]
    res = Result()
    note = f"median of {repeats} x {duration:.0f} s or more"
    for k in LEVELS:
        key = str(k)
        res.rows.append(
            Row(
                "throughput",
                f"tool calls/s, {k} in flight",
                "calls/s",
                median(rates["Tendon"][key]),
                median(rates["floor"][key]),
                median(rates["Celery"][key]) if celery_ok else None,
                median(rates["DBOS"][key]) if dbos else None,
                target="not below Celery" if k == TARGET_LEVEL else "",
                note=note + ("; Tendon: 1-call turns" if k == TARGET_LEVEL else ""),
            )
        )
    res.rows.append(
        Row(
            "throughput",
            f"tool calls/s, {TARGET_LEVEL} in flight as {TARGET_LEVEL // WIDE} turns of {WIDE} calls",
            "calls/s",
            median([lv.rate for lv in at_target[WIDE_NAME]]),
            median(rates["floor"][str(TARGET_LEVEL)]),
            median(rates["Celery"][str(TARGET_LEVEL)]) if celery_ok else None,
            median(rates["DBOS"][str(TARGET_LEVEL)]) if dbos else None,
            note=f"{note}; the calls of a turn share its model steps; the other columns are their "
            f"{TARGET_LEVEL}-in-flight figures",
        )
    )
    if celery_ok or dbos:
        for k in LEVELS:
            key = str(k)
            res.rows.append(
                Row(
                    "throughput",
                    f"tool calls/s, {k} in flight, {LIKE}",
                    "calls/s",
                    median(rates["Tendon"][key]),
                    median(rates["floor"][key]),
                    median(rates[CHAIN_NAME][key]) if celery_ok else None,
                    median(rates[THREE_NAME][key]) if dbos else None,
                    note=f"{note}; Tendon: 1-call turns; a Celery call: model -> tool -> model tasks, "
                    "each through the broker; a DBOS call: 3 steps in the workflow's process",
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
    cpu = {name: median_cpu(levels) for name, levels in at_target.items() if levels}
    res.rows += cpu_rows(cpu, celery_ok)
    if celery_ok:
        res.rows += chain_cpu_rows(cpu)
    res.series["cpu"] = cpu
    if celery_ok:
        res.rows.append(
            Row(
                "latency",
                "1 call p50 (Celery: apply_async to result via rpc://)",
                "ms",
                None,
                None,
                median(res_lat) * 1000,
                note="compare with the client-observed latency row; a chain of 3 tasks: the "
                "latency scenario's like-for-like rows",
            )
        )
    res.series["throughput"] = {name: {k: median(v) for k, v in per.items()} for name, per in rates.items()}
    return res


# role -> its row's label and the sides whose processes have it (the floor runs in the harness)
ROLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "Brain": ("the Brain", ("Tendon",)),
    "Hands": ("the Hands (both processes)", ("Tendon",)),
    "PostgreSQL": ("PostgreSQL", ("Tendon", "floor")),
    "RabbitMQ": ("RabbitMQ", ("Tendon", "floor", "Celery")),
    HARNESS: ("the harness process", ("Tendon", "floor", "Celery")),
    "Celery worker": ("the Celery worker (prefork children included)", ("Celery",)),
}


def cpu_rows(cpu: Mapping[str, Mapping[str, float]], celery_ok: bool) -> list[Row]:
    """CPU ms per call at the target level: in all, and by role.

    Tendon and the floor always run here, Celery when ``celery_ok``. A role's row is written
    whenever a side that ran has that role, and a figure such a side lacks is named "not
    measured" in the note: a row never vanishes because a measurement came back empty.
    """
    tendon, wide = cpu.get("Tendon", {}), cpu.get(WIDE_NAME, {})
    floor, celery = cpu.get("floor", {}), cpu.get("Celery", {}) if celery_ok else {}
    ran = ("Tendon", "floor", "Celery") if celery_ok else ("Tendon", "floor")

    def total(roles: Mapping[str, float]) -> float | None:
        return sum(roles.values()) if roles else None

    def unmeasured(figures: Mapping[str, float | None]) -> str:
        missing = [side for side, value in figures.items() if side in ran and value is None]
        return f"; not measured: {', '.join(missing)}" if missing else ""

    where = f"at {TARGET_LEVEL} in flight, median of the repeats; user + system time from /proc"
    totals = {"floor": total(floor), "Celery": total(celery)}
    rows = [
        Row(
            "cpu",
            "CPU per call, all processes",
            "ms",
            total(tendon),
            totals["floor"],
            totals["Celery"],
            note=f"{where}; on 2 cores, calls/s is about 2000 / this"
            + unmeasured({"Tendon": total(tendon), **totals}),
        ),
        Row(
            "cpu",
            f"CPU per call, all processes, turns of {WIDE} calls",
            "ms",
            total(wide),
            totals["floor"],
            totals["Celery"],
            note=f"Tendon's {TARGET_LEVEL // WIDE} turns of {WIDE} calls; the other columns as above"
            + unmeasured({"Tendon": total(wide), **totals}),
        ),
    ]
    for role, (label, sides) in ROLES.items():
        figures = {"Tendon": tendon.get(role), "floor": floor.get(role), "Celery": celery.get(role)}
        if not any(side in ran for side in sides) and all(v is None for v in figures.values()):
            continue
        note = (
            "harness: Tendon's submits and polls; the whole floor (it runs here); the Celery client"
            if role == HARNESS
            else f"at {TARGET_LEVEL} in flight" + ("; Tendon: 1-call turns" if "Tendon" in sides else "")
        )
        rows.append(
            Row(
                "cpu",
                f"CPU per call: {label}",
                "ms",
                tendon=figures["Tendon"],
                floor=figures["floor"],
                celery=figures["Celery"],
                note=note + unmeasured({side: figures[side] for side in sides}),
            )
        )
    return rows


def chain_cpu_rows(cpu: Mapping[str, Mapping[str, float]]) -> list[Row]:
    """CPU ms per call of the Celery chain of 3 tasks at the target level, in all and by the
    roles a Celery call has, beside Tendon's 1-call turn (as in ``cpu_rows``, a figure that
    came back empty keeps its row and is named "not measured")."""
    tendon, chain = cpu.get("Tendon", {}), cpu.get(CHAIN_NAME, {})
    where = f"at {TARGET_LEVEL} in flight, median of the repeats; Tendon: 1-call turns"

    def missing(figure: float | None) -> str:
        return "" if figure is not None else f"; not measured: {CHAIN_NAME}"

    total = sum(chain.values()) if chain else None
    rows = [
        Row(
            "cpu",
            f"CPU per call, all processes, {CHAIN_NAME} (like a 1-call turn)",
            "ms",
            sum(tendon.values()) if tendon else None,
            celery=total,
            note=f"{where}; on 2 cores, calls/s is about 2000 / this" + missing(total),
        )
    ]
    for role in ("Celery worker", "RabbitMQ", HARNESS):
        label = ROLES[role][0]
        rows.append(
            Row(
                "cpu",
                f"CPU per call: {label}, {CHAIN_NAME}",
                "ms",
                tendon.get(role),
                celery=chain.get(role),
                note=where + missing(chain.get(role)),
            )
        )
    return rows
