"""The batch executor with the Brain and Hands as real processes on PostgreSQL and RabbitMQ: a
parallel batch through a Hands SIGKILL, and a cancel in the middle of one (the crashes of
test_batch_recovery.py). What ran, and how many at once, is measured from the tool's side
(tests.batch_tools)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from brain.rules.batches import child_id
from tests.batch_support import BRAIN, HANDS, batch_row, effects, submit, world
from tests.batch_tools import events, most_at_once
from tests.support import Observer, Processes, TendonEnv, run_cli, wait_for

pytestmark = pytest.mark.chaos


async def test_a_parallel_batch_of_20_through_a_hands_sigkill_runs_each_call_once_at_most_4_at_once(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    # Given two Hands workers, either of which dies right after the body of call 9 returned (its
    # effect happened, nothing of it was saved)
    env = world(tendon, tmp_path)
    armed = {**env, "TENDON_KILL_AT": "hands.after_tool_body@call-1#9"}
    await processes.start_ready("brain", BRAIN, env)
    workers = [await processes.start_ready("hands", HANDS, armed) for _ in range(2)]

    # When a batch of 20 calls runs, at most 4 at once
    items = [{"n": i, "delay": 0.3} for i in range(20)]
    turn_id = await submit(env, tmp_path, {"tool": "step", "items": items, "mode": "parallel", "limit": 4})
    obs = Observer(tendon)
    await obs.wait_turn(turn_id, "completed", timeout=90)

    # Then one worker was killed, and call 9 was verified by its operation id, not run again
    assert sorted(w.poll() for w in workers if w.poll() is not None) == [-signal.SIGKILL]
    batch = await batch_row(obs, turn_id)
    ids = [child_id(batch["id"], i) for i in range(20)]
    log = events(tmp_path / "log")
    assert effects(log) == Counter(ids)  # every call's effect happened exactly once
    killed_at = next(at for what, op, _, at in log if what == "end" and op == ids[9])
    assert 2 <= most_at_once(log, killed_at=killed_at + 0.05) <= 4
    rows = {r["id"]: r for r in await obs.executions(turn_id)}
    assert rows[ids[9]]["how"] == "verified_by_query"
    assert all(rows[i]["status"] == "succeeded" for i in ids)
    # The batch's result links each call with its execution, in order
    assert batch["status"] == "succeeded"
    calls = batch["result"]["calls"]
    assert [(c["index"], c["execution_id"], c["status"]) for c in calls] == [
        (i, ids[i], "succeeded") for i in range(20)
    ]
    assert calls[9]["how"] == "verified_by_query"
    # A watcher saw the batch accepted and its progress to the end
    progress = await obs.facts(turn_id, "batch.progress")
    assert (await obs.facts(turn_id, "batch.accepted"))[0]["size"] == 20
    assert progress[-1]["ended"] == "succeeded" and progress[-1]["done"] == 20
    assert all(p["in_flight"] <= 4 for p in progress)
    assert await obs.orphans() == {}  # the manifest names its call's execution and its turn


async def test_a_cancel_in_the_middle_of_a_batch_admits_no_new_call(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    env = world(tendon, tmp_path)
    await processes.start_ready("brain", BRAIN, env)
    await processes.start_ready("hands", HANDS, env)
    items = [{"n": i, "delay": 1.0} for i in range(10)]
    turn_id = await submit(env, tmp_path, {"tool": "step", "items": items, "mode": "parallel", "limit": 2})

    async def two_started() -> bool:
        return sum(1 for what, *_ in events(tmp_path / "log") if what == "start") >= 2

    await wait_for(two_started, timeout=30, what="the first two calls to start")
    code, _, err = await run_cli(["-m", "brain", "cancel", turn_id, "--request-id", "c1"], env)
    assert code == 0, err
    obs = Observer(tendon)
    await obs.wait_turn(turn_id, "cancelled", timeout=30)

    # Then only the calls admitted before the cancel ever reached the Hands (how many depends on
    # how long the cancel took to come), and no more come
    ledger = await obs.ledger()
    reached = len(ledger)
    assert 2 <= reached < 10
    rows = [r for r in await obs.executions(turn_id) if r["tool"] == "step"]
    assert len(rows) == 10 and all(r["status"] == "cancelled" or r["status"] == "succeeded" for r in rows)
    never_sent = [r for r in rows if r["id"] not in {x["execution_id"] for x in ledger}]
    assert len(never_sent) == 10 - reached and all(r["status"] == "cancelled" for r in never_sent)
    batch = await batch_row(obs, turn_id)
    assert batch["status"] == "cancelled"
    await asyncio.sleep(1.0)  # a call admitted late would have reached the Hands by now
    assert len(await obs.ledger()) == reached
    starts = [n for what, _, n, _ in events(tmp_path / "log") if what == "start"]
    assert len(starts) == reached


@pytest.mark.skipif(
    not os.environ.get("TENDON_TEST_BATCH_FIGURES"), reason="figures: TENDON_TEST_BATCH_FIGURES=1"
)
@pytest.mark.parametrize(("mode", "limit", "size"), [("parallel", 16, 500), ("ordered", 1, 200)])
async def test_figures_of_a_batch_of_calls_that_do_nothing(
    tendon: TendonEnv, processes: Processes, tmp_path: Path, mode: str, limit: int, size: int
) -> None:
    """The figures in docs/batches.md: calls per second through one Brain and one Hands worker."""
    env = world(tendon, tmp_path)
    await processes.start_ready("brain", BRAIN, env)
    await processes.start_ready("hands", HANDS, env)
    items = [{"n": i, "delay": 0} for i in range(size)]
    started = time.monotonic()
    turn_id = await submit(env, tmp_path, {"tool": "step", "items": items, "mode": mode, "limit": limit})
    obs = Observer(tendon)
    await obs.wait_turn(turn_id, "completed", timeout=600)
    took = time.monotonic() - started
    log = events(tmp_path / "log")
    assert len(effects(log)) == size and most_at_once(log) <= limit
    print(f"\nbatch {mode} limit {limit}: {size} calls in {took:.2f} s, {size / took:.0f} calls/s")
