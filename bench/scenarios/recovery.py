"""Recovery: SIGKILL a Hands worker inside a tool body, a Brain mid-turn, and Celery workers.

Hands (default settings otherwise): two Hands processes; the one running the tool is killed.
*safe*: seconds from SIGKILL until the tool body starts again (in the survivor), from the
signal's wall-clock time to the time the body itself records when it starts.
*unsafe* (no query): seconds from SIGKILL until the Brain shows the execution UNKNOWN.

Brain, two trial kinds, each with a standby Brain already running:

*waiting*: a turn waits on a tool; the owning Brain is SIGKILLed at the moment the tool's
answer is released; seconds from SIGKILL until the turn is completed. No lease is held then.

*mid-step*: the Brain is SIGKILLed while it owns the turn (lease held, claim committed) in the
middle of its model step: the model has answered, nothing of the reply is committed. To land
the kill there deterministically the harness holds ``LOCK TABLE executions IN SHARE ROW
EXCLUSIVE MODE`` (in the world's own schema) while the turn runs, so the Brain's reply commit
(which inserts the turn's intents) waits; the harness sees that wait in ``pg_locks``, reads the owner from
``turns.lease_owner`` (a worker id that carries its PID), SIGKILLs that Brain and releases the
lock. Seconds from SIGKILL until the turn is completed by the standby, which must notice the
owner is dead (its liveness lock vanished with its session, and the broker no longer sees it:
``infra.liveness``), hand its turn back and claim it, redo the model step, dispatch, and finish.

A process judges others only once its own liveness has been up for a moment (``SETTLE``: it
may itself have just reconnected). The replacements the trials start are given that moment
before the next trial, so that every trial measures a pool in its steady state.
To the store this is what a Brain killed during a slow model call looks like; the one
difference is that the killed Brain's blocked backend ends when the lock is released (its
uncommitted insert is rolled back), not at once.

Celery (if installed; also in --quick): the same gated body, SIGKILL of the prefork child
running it and of the whole worker with a second worker running; see
``bench/peers/celery_bench.py`` for what Celery does in each case.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid

import asyncpg

from bench.harness import TendonWorld, gate_starts, median, one_call_agent, pct, wait_for
from bench.peers import celery_bench
from bench.scenarios.base import Context, Result, Row
from infra.liveness import SETTLE_AT_MOST
from infra.process.settings import Settings

# The pause that lets a replacement settle: the default grace (TENDON_* settings are not read
# at import), at most SETTLE_AT_MOST, and a little margin.
SETTLE = min(Settings.model_fields["reconnect_grace"].default, SETTLE_AT_MOST) + 0.2

HANDS_SAFE = "Hands kill, safe: re-run"
HANDS_UNSAFE = "Hands kill, unsafe: UNKNOWN"
BRAIN_WAITING = "Brain kill: standby completes"
BRAIN_MIDSTEP = "Brain kill mid-step (lease held): standby completes"
CELERY_CHILD = "Celery: prefork child SIGKILL, task body again"
CELERY_WORKER = "Celery: whole worker SIGKILL, body again in a 2nd worker"


async def hands_trial(world: TendonWorld, safe: bool, workers: list, timeout: float) -> float:
    gate = uuid.uuid4().hex[:8]
    tool = "sleepy_safe" if safe else "sleepy_unsafe"
    tid = await world.submit(one_call_agent(tool, gate=gate))
    started = world.gate(f"{gate}.started")

    async def first() -> list[tuple[int, float]]:
        return gate_starts(started)

    pid = (await wait_for(first, timeout=timeout, what="tool body start"))[0][0]
    victim = next(p for p in workers if p.pid == pid)
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    victim.wait(timeout=10)
    workers.remove(victim)
    if safe:

        async def rerun() -> list[tuple[int, float]]:
            starts = gate_starts(started)
            return starts if len(starts) >= 2 else []

        took = (await wait_for(rerun, timeout=timeout, interval=0.01, what="re-run"))[1][1] - killed_at
    else:

        async def unknown() -> bool:
            rows = await world.fetch("SELECT status FROM executions WHERE turn_id = $1", tid)
            return bool(rows) and rows[0]["status"] == "unknown"

        await wait_for(unknown, timeout=timeout, interval=0.01, what="UNKNOWN")
        took = time.monotonic() - t0
    world.gate(gate).touch()
    workers.append(await world.start_hands())
    await asyncio.sleep(SETTLE)  # the replacement may be the next trial's survivor
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


def _owner_pid(worker_id: str) -> int:
    """The PID in a worker id (``brain-<host>-<pid>-<random>``, see infra/liveness/)."""
    return int(worker_id.rsplit("-", 2)[1])


async def brain_midstep_trial(world: TendonWorld, brains: list, timeout: float) -> float:
    """Kill the Brain that owns a turn while its model step is in flight; see the module doc."""
    while len([b for b in brains if b.poll() is None]) < 2:  # the owner-to-be and a standby
        brains.append(await world.start_brain())
        await asyncio.sleep(SETTLE)
    table = f'"{world.brain_schema}".executions'
    conn = await asyncpg.connect(world.services.database_url)
    try:
        tx = conn.transaction()
        await tx.start()
        await conn.execute(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")
        tid = await world.submit(one_call_agent("noop"))

        async def blocked() -> bool:
            return bool(
                await conn.fetchval(
                    "SELECT EXISTS (SELECT 1 FROM pg_locks"
                    " WHERE relation = $1::text::regclass AND NOT granted)",
                    table,
                )
            )

        what = "the Brain's model-reply commit (its intents) to wait on the executions lock"
        await wait_for(blocked, timeout=min(timeout, 20.0), interval=0.005, what=what)
        owner_id = await conn.fetchval(
            f'SELECT lease_owner FROM "{world.brain_schema}".turns WHERE id = $1', tid
        )
        if owner_id is None:
            raise RuntimeError("the turn has no lease owner while its model step is blocked")
        pid = _owner_pid(owner_id)
        owner = next((b for b in brains if b.pid == pid and b.poll() is None), None)
        if owner is None:  # only ever signal a process this harness started
            raise RuntimeError(f"lease owner {owner_id} is not one of this run's Brains")
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        await tx.rollback()  # the lock goes: the dead Brain's blocked statement ends, the standby may commit
    finally:
        await conn.close()  # rolls back too if anything above failed
    owner.wait(timeout=10)
    brains.remove(owner)
    await world.wait_done([tid], timeout=timeout, interval=0.01)
    return time.monotonic() - t0


async def celery_trials(ctx: Context, series: dict[str, list[float]], timeout: float) -> list[str]:
    """Run the Celery worker-kill trials into ``series``; returns where the bodies ran again."""
    where: list[str] = []
    async with celery_bench.CeleryPeer(ctx.services.amqp_url, ctx.procs) as peer:
        await peer.start_worker_ready()  # a second worker: the survivor of a whole-worker kill
        for _ in range(ctx.n(1, 20)):  # up to ~5 s each (see the note), hence 1 in quick mode
            res = await peer.kill_trial(whole_worker=False, timeout=timeout)
            series[CELERY_CHILD].append(res["seconds"])
            where.append(f"child kill: {res['ran_again_in']}")
        n = ctx.n(1, 20)
        for i in range(n):
            res = await peer.kill_trial(whole_worker=True, timeout=timeout, replace=i < n - 1)
            series[CELERY_WORKER].append(res["seconds"])
            where.append(f"worker kill: {res['ran_again_in']}")
    return where


async def run(ctx: Context) -> Result:
    trials = ctx.n(1, 20)  # quick: one of each, the smoke test only needs the rows
    timeout = 90.0
    series: dict[str, list[float]] = {
        HANDS_SAFE: [],
        HANDS_UNSAFE: [],
        BRAIN_WAITING: [],
        BRAIN_MIDSTEP: [],
        CELERY_CHILD: [],
        CELERY_WORKER: [],
    }
    world = TendonWorld(ctx.services, ctx.procs)
    try:
        brains: list[subprocess.Popen[bytes]] = [await world.start_brain()]
        workers = [await world.start_hands(), await world.start_hands()]
        await world.open()
        for _ in range(trials):
            series[HANDS_SAFE].append(await hands_trial(world, True, workers, timeout))
            series[HANDS_UNSAFE].append(await hands_trial(world, False, workers, timeout))
        for _ in range(trials):
            series[BRAIN_WAITING].append(await brain_trial(world, brains, timeout))
        for _ in range(trials):
            series[BRAIN_MIDSTEP].append(await brain_midstep_trial(world, brains, timeout))
    finally:
        await world.cleanup()
    celery_where: list[str] = []
    if not celery_bench.available():
        ctx.notes.append("Celery is not installed (pip install -e '.[bench]'): no Celery worker-kill trials")
    else:
        celery_where = await celery_trials(ctx, series, timeout)
    targets = {
        HANDS_SAFE: "p50 <= 1 s",
        HANDS_UNSAFE: "p50 <= 1 s",
        BRAIN_WAITING: "p50 <= 2 s",
        BRAIN_MIDSTEP: "p50 <= 2 s",
    }
    notes = {
        HANDS_SAFE: "Celery column: the prefork child running the task SIGKILLed (same gated body)",
        BRAIN_WAITING: "turn WAITING, no lease held",
        BRAIN_MIDSTEP: "model replied, reply not committed; standby notices at its next claim look",
        CELERY_WORKER: "Celery only: worker main process SIGKILLed, RabbitMQ requeues on connection close",
    }
    res = Result(series={"recovery": {k: v for k, v in series.items() if v}})
    for name, xs in series.items():
        if name in (CELERY_CHILD,) or not xs:
            continue  # the child kill goes in the Celery column of the Hands safe re-run rows
        for q in (50, 95):
            celery_only = name == CELERY_WORKER
            celery = series[CELERY_CHILD] if name == HANDS_SAFE else xs if celery_only else []
            note = _trials_note(xs, celery, celery_only) + (f"; {notes[name]}" if name in notes else "")
            res.rows.append(
                Row(
                    "recovery",
                    f"{name} p{q}",
                    "s",
                    None if celery_only else pct(xs, q),
                    celery=pct(celery, q) if celery else None,
                    target=targets.get(name, "") if q == 50 else "",
                    note=note,
                )
            )
    medians = ", ".join(f"{k} {median(v):.2f}s" for k, v in series.items() if v)
    ctx.notes.append(f"recovery: medians {medians}")
    if celery_where:
        counts = {w: celery_where.count(w) for w in sorted(set(celery_where))}
        ctx.notes.append(
            "recovery, Celery (acks_late, task_reject_on_worker_lost, prefork -c 2, 2 workers): "
            "a killed child makes the worker reject the message with requeue (WorkerLostError) and "
            "RabbitMQ redelivers it, but the worker notices the dead child either at once (its "
            "sentinel) or only at its 5 s maintain_pool timer, so a child kill costs ~0.05 s or "
            "anything up to 5 s; a killed worker (its children die by PDEATHSIG) leaves the message unacked "
            "until RabbitMQ sees the connection close, then it is requeued to the other worker at "
            "once. Child-kill seconds: "
            + ", ".join(f"{x:.2f}" for x in series[CELERY_CHILD])
            + ". Where the body ran again: "
            + ", ".join(f"{w} x{n}" for w, n in counts.items())
        )
    return res


def _trials_note(tendon: list[float], celery: list[float], celery_only: bool) -> str:
    if celery_only:
        return f"{len(tendon)} Celery trials"
    if celery:
        return f"{len(tendon)} trials (Celery {len(celery)})"
    return f"{len(tendon)} trials"
