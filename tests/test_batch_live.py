"""The batch executor with the Brain and Hands as real processes on PostgreSQL and RabbitMQ: a
parallel batch through a Hands SIGKILL, an ordered one through a Brain SIGKILL, and a cancel in the
middle of one. What ran, and how many at once, is measured from the tool's side (tests.batch_tools)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from brain.rules.batches import child_id
from tests.batch_tools import events, most_at_once
from tests.support import Observer, Processes, TendonEnv, run_cli, wait_for

BRAIN = ["-m", "brain", "serve"]
HANDS = ["-m", "hands", "serve", "--route", "bulk", "--tools", "tests.batch_tools"]

pytestmark = pytest.mark.chaos


def world(tendon: TendonEnv, tmp_path: Path) -> dict[str, str]:
    tendon.routes.add("bulk")
    return {**tendon.env, "BATCH_LOG_FILE": str(tmp_path / "log"), "BATCH_DONE_DIR": str(tmp_path)}


async def submit(env: dict[str, str], tmp_path: Path, args: dict[str, Any]) -> str:
    script = [{"tool_calls": [{"tool": "batch", "args": args}]}, {"content": "done: {results}"}]
    agent = {"name": "batcher", "version": "1", "tools": ["batch", "step", "blind"],
             "model": {"kind": "scripted", "script": script}}  # fmt: skip
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(agent), encoding="utf-8")
    command = ["-m", "brain", "submit", "--session", "s", "--request-id", "r1", "--agent", str(path), "go"]
    code, out, err = await run_cli(command, env)
    assert code == 0, err
    return out.strip()


async def batch_row(obs: Observer, turn_id: str) -> Any:
    (row,) = [e for e in await obs.executions(turn_id) if e["tool"] == "batch"]
    return row


def effects(log: list[tuple[str, str, int, float]]) -> Counter[str]:
    return Counter(op for what, op, _, _ in log if what == "effect")


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


@pytest.mark.parametrize(
    "kill_at",
    ["brain.after_apply_commit@succeeded", "brain.after_intent_commit@call-1#0"],
    ids=["after-an-admission-commit", "after-the-manifest-commit-before-publish"],
)
async def test_an_ordered_batch_keeps_its_order_through_a_brain_sigkill(
    tendon: TendonEnv, processes: Processes, tmp_path: Path, kill_at: str
) -> None:
    # Given a Brain that dies right after it committed the first call's success (and with it the
    # admission of the second, whose command it may not have sent), or the batch's manifest (the
    # first call's command not sent)
    env = world(tendon, tmp_path)
    first = await processes.start_ready("brain", BRAIN, {**env, "TENDON_KILL_AT": kill_at})
    await processes.start_ready("hands", HANDS, env)
    items = [{"n": i, "delay": 0.1} for i in range(6)]
    turn_id = await submit(env, tmp_path, {"tool": "step", "items": items, "mode": "ordered"})
    assert await processes.wait_exit(first) == -signal.SIGKILL

    # When another Brain takes over
    await processes.start_ready("brain", BRAIN, env)
    obs = Observer(tendon)
    await obs.wait_turn(turn_id, "completed", timeout=60)

    # Then the calls ran one at a time, in order, each once
    log = events(tmp_path / "log")
    assert [n for what, _, n, _ in log if what == "start"] == list(range(6))
    assert most_at_once(log) == 1
    batch = await batch_row(obs, turn_id)
    assert effects(log) == Counter(child_id(batch["id"], i) for i in range(6))
    assert [c["status"] for c in batch["result"]["calls"]] == ["succeeded"] * 6


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

    # Then only the calls admitted before the cancel ever reached the Hands, and no more come
    ledger = await obs.ledger()
    reached = len(ledger)
    assert 2 <= reached <= 4
    rows = [r for r in await obs.executions(turn_id) if r["tool"] == "step"]
    assert len(rows) == 10 and all(r["status"] == "cancelled" or r["status"] == "succeeded" for r in rows)
    never_sent = [r for r in rows if r["id"] not in {x["execution_id"] for x in ledger}]
    assert len(never_sent) == 10 - reached and all(r["status"] == "cancelled" for r in never_sent)
    batch = await batch_row(obs, turn_id)
    assert batch["status"] == "cancelled"
    await asyncio.sleep(1.5)  # a call admitted late would have reached the Hands by now
    assert len(await obs.ledger()) == reached
    starts = [n for what, _, n, _ in events(tmp_path / "log") if what == "start"]
    assert len(starts) == reached


async def test_an_unknown_call_holds_an_ordered_batch_until_it_is_reconciled(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    # Given a worker that dies right after call 1's body acted, through a service nobody can ask
    env = world(tendon, tmp_path)
    await processes.start_ready("brain", BRAIN, env)
    doomed = await processes.start_ready(
        "hands", HANDS, {**env, "TENDON_KILL_AT": "hands.after_tool_body@call-1#1"}
    )
    items = [{"n": i} for i in range(4)]
    turn_id = await submit(env, tmp_path, {"tool": "blind", "items": items, "mode": "ordered"})
    assert await processes.wait_exit(doomed) == -signal.SIGKILL
    await processes.start_ready("hands", HANDS, env)

    # Then call 1 is UNKNOWN, and the batch runs nothing after it: its order says so
    obs = Observer(tendon)
    batch = await batch_row(obs, turn_id)
    one = child_id(batch["id"], 1)

    async def unknown() -> bool:
        rows = {r["id"]: r for r in await obs.executions(turn_id)}
        return rows[one]["status"] == "unknown"

    await wait_for(unknown, timeout=30, what="call 1 to be UNKNOWN")
    await asyncio.sleep(1.0)
    assert [n for what, _, n, _ in events(tmp_path / "log") if what == "start"] == [0, 1]
    assert (await batch_row(obs, turn_id))["status"] == "pending"
    turn = await obs.turn(turn_id)
    assert turn is not None and turn["status"] == "waiting" and "reconcile" in turn["waiting_for"]

    # When an operator reconciles it, the batch goes on and completes
    command = ["-m", "hands", "reconcile", one, "--result", '{"n": 1}', "--evidence", "the service's log"]
    code, _, err = await run_cli(command, env)
    assert code == 0, err
    await obs.wait_turn(turn_id, "completed", timeout=60)
    log = events(tmp_path / "log")
    assert [n for what, _, n, _ in log if what == "start"] == [0, 1, 2, 3]
    assert effects(log) == Counter(child_id(batch["id"], i) for i in range(4))
    calls = (await batch_row(obs, turn_id))["result"]["calls"]
    assert [c["status"] for c in calls] == ["succeeded"] * 4 and calls[1]["how"] == "reconciled"


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
