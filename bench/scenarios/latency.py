"""Latency: sequential one-tool turns against the floor in the same run.

The headline is "submit to result applied": from the submit commit to the commit in which
the Brain applied the tool's result, the span the floor covers. The whole turn (a second
model step and the finalize included) is reported beside it.

Tendon's time is ``turns.updated_at - turns.created_at`` of a completed turn: from the
submit transaction to the completing transaction, both stamped by PostgreSQL. The floor's is
stamped the same way (intent transaction to the Brain's result transaction). The added cost
of one tool call is the median of a 2-call turn minus the median of a 1-call turn. Tendon and the
floor run in alternating blocks, so that a host whose speed moves meets both alike; Tendon's
client submits each turn and waits for it through the API in one request (``POST
/v1/sessions/{id}/turns?wait=``, what ``AsyncClient.call`` does), as a client that wants the
answer does.

DBOS (full mode, ``bench/peers/dbos_bench.py``): a one-step workflow, from
``start_workflow_async`` to its result at the caller, in the client-observed rows. Like for
like with the 1-call turn (model step, tool call, model step), full mode also has rows with a
Celery chain of 3 tasks (``apply_async`` to the last task's result over ``rpc://``, a worker of
2 prefork processes) and a DBOS workflow of 3 steps; the single-task Celery figure is the
throughput scenario's.
"""

from __future__ import annotations

import time

from bench.floor import Floor
from bench.harness import TendonWorld, median, one_call_agent, pct
from bench.peers import celery_bench, dbos_bench
from bench.scenarios.base import Context, Result, Row

BLOCKS = 4  # Tendon and the floor alternate in this many blocks each


async def tendon_sequential(
    world: TendonWorld, calls: int, n: int
) -> tuple[list[float], list[float], list[float], list[str]]:
    """Run ``n`` turns of ``calls`` sequential tool calls one at a time.

    Returns (submit to completed, client-observed, submit to first result applied), seconds,
    and the turns' ids.
    """
    definition = one_call_agent("noop", calls=calls)
    ids, client = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        tid = await world.call(definition, timeout=30)
        client.append(time.perf_counter() - t0)
        ids.append(tid)
    return await world.server_latencies(ids), client, await world.result_applied_latencies(ids), ids


def blocks(n: int, count: int = BLOCKS) -> list[int]:
    """``n`` split into ``count`` near-equal blocks (none empty)."""
    count = max(1, min(count, n))
    return [n // count + (1 if i < n % count else 0) for i in range(count)]


async def run(ctx: Context) -> Result:
    n = ctx.n(15, 200)
    world = TendonWorld(ctx.services, ctx.procs)
    one: list[float] = []
    one_client: list[float] = []
    applied: list[float] = []
    two: list[float] = []
    fl: list[float] = []
    fl2: list[float] = []
    ones: list[str] = []  # the 1-call turns' ids
    cuts: dict[str, list[float]] = {}
    floor_cuts: dict[str, list[float]] = {}
    try:
        await world.start_brain()
        await world.start_hands()
        await world.open()
        await tendon_sequential(world, 1, ctx.n(3, 30))  # warm up: bindings, caches, connections
        async with Floor(ctx.services.database_url, ctx.services.amqp_url) as floor:
            await floor.sequential(5)
            await world.settle()
            await floor.settle()
            # Tendon and the floor take turns, block by block, so that both meet the host as it
            # is then: its speed moves from minute to minute, and the ratio is what is read.
            for size in blocks(n):
                a, c, r, i = await tendon_sequential(world, 1, size)
                one, one_client, applied, ones = one + a, one_client + c, applied + r, ones + i
                fl += await floor.sequential(size)
            floor_client = floor.latencies[5 : 5 + n]
            cuts, floor_cuts = await world.stretches(ones), await floor.stretches()
            for size in blocks(n):
                two += (await tendon_sequential(world, 2, size))[0]
                pairs = zip(await floor.sequential(size), await floor.sequential(size), strict=True)
                fl2 += [a + b for a, b in pairs]
    finally:
        await world.cleanup()
    chain: list[float] = []
    if not celery_bench.skipped(ctx):
        try:
            async with celery_bench.CeleryPeer(ctx.services.amqp_url, ctx.procs) as peer:
                await peer.sequential(20, chain=True)  # warm up: the worker's and the client's connections
                chain = await peer.sequential(n, chain=True)
        except Exception as exc:  # noqa: BLE001 - reported, the Tendon figures still stand
            ctx.notes.append(f"Celery chain latency FAILED, its cells are empty: {type(exc).__name__}: {exc}")
    dbos = await dbos_bench.maybe_run(ctx, "latency", timeout=300, n=n, warmup=20)
    dbos_lat: list[float] = dbos["latencies"] if dbos else []
    dbos_3: list[float] = dbos["latencies_3"] if dbos else []

    ms = 1000.0
    res = Result()
    for q in (50, 99):
        res.rows.append(
            Row(
                "latency",
                f"submit to result applied p{q}",
                "ms",
                pct(applied, q) * ms,
                pct(fl, q) * ms,
                target="p50 <= 1.5x floor" if q == 50 else "",
                note="Tendon: submit commit to the commit applying the result; floor: the same span",
            )
        )
    for q in (50, 99):
        res.rows.append(
            Row(
                "latency",
                f"1-call turn p{q}",
                "ms",
                pct(one, q) * ms,
                pct(fl, q) * ms,
                note="to the turn's completion: also a second model step and the finalize",
            )
        )
    for q in (50, 99):
        res.rows.append(
            Row(
                "latency",
                f"1-call turn p{q}, client-observed",
                "ms",
                pct(one_client, q) * ms,
                pct(floor_client, q) * ms,
                dbos=pct(dbos_lat, q) * ms if dbos_lat else None,
                note="Tendon: submit and wait through the HTTP API; floor: an in-process future"
                + ("; DBOS: 1-step workflow, start_workflow_async to result, in-process" if dbos_lat else ""),
            )
        )
    for q in (50, 99) if chain or dbos_3 else ():
        res.rows.append(
            Row(
                "latency",
                f"1-call turn p{q}, client-observed, like for like (Celery: chain of 3 tasks; "
                "DBOS: workflow of 3 steps)",
                "ms",
                pct(one_client, q) * ms,
                pct(floor_client, q) * ms,
                pct(chain, q) * ms if chain else None,
                pct(dbos_3, q) * ms if dbos_3 else None,
                note="Celery: model -> tool -> model tasks, apply_async to the last one's result "
                "via rpc://; DBOS: 3 steps, start_workflow_async to result, in-process",
            )
        )
    res.rows += stretch_rows(cuts, {**floor_cuts, "rest": fl})
    res.rows.append(Row("latency", "2-call turn p50", "ms", median(two) * ms, median(fl2) * ms))
    res.rows.append(
        Row(
            "latency",
            "added cost of one tool call (p50 2-call - p50 1-call)",
            "ms",
            (median(two) - median(one)) * ms,
            (median(fl2) - median(fl)) * ms,
        )
    )
    res.series["latency"] = {"tendon_1": one, "tendon_2": two, "floor_1": fl, "floor_2": fl2}
    if dbos_lat:
        res.series["latency"]["dbos_1"] = dbos_lat
        res.series["latency"]["dbos_3"] = dbos_3
    if chain:
        res.series["latency"]["celery_chain"] = chain
    return res


# What each stretch of the span holds: it runs from one transaction's start on it to the next's.
STRETCH_NOTES = {
    "submit": "the submit's statement and commit, the first model step, to the reply's start; "
    "the floor has none (its span starts at its intent, the reply's counterpart)",
    "reply": "the reply's statement with its intent, its commit, the command's publish and delivery, "
    "to the Hands' accept (floor: its intent's transaction onwards)",
    "accept": "the accept's statement and commit, the ack, the tool, to the outcome's start",
    "outcome": "the outcome's statement and commit, the events' publish and delivery, to the apply's start",
    "rest": "the span less the submit's stretch (floor: its whole span)",
}


def stretch_rows(cuts: dict[str, list[float]], floor_cuts: dict[str, list[float]]) -> list[Row]:
    """The latency headline's span cut at each commit on it, p50 of each stretch, beside the
    floor's (which has no submit, and whose whole span stands against Tendon's rest)."""
    rows = []
    for key, note in STRETCH_NOTES.items():
        mine = cuts.get(key) or []
        floor = floor_cuts.get(key) or []
        if not mine:
            continue
        rows.append(
            Row(
                "latency",
                f"submit to result applied p50, stretch: {key}",
                "ms",
                median(mine) * 1000.0,
                median(floor) * 1000.0 if floor else None,
                note=note,
            )
        )
    return rows
