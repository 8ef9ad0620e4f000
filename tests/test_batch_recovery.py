"""The batch executor through crashes, with the Brain and Hands as real processes on PostgreSQL and
RabbitMQ: an ordered batch through two Brain SIGKILLs, and a call a Hands SIGKILL left UNKNOWN
holding its ordered batch until it is reconciled."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path

import pytest

from brain.rules.batches import child_id
from tests.batch_support import BRAIN, HANDS, batch_row, effects, submit, world
from tests.batch_tools import events, most_at_once
from tests.support import Observer, Processes, TendonEnv, run_cli, wait_for

pytestmark = pytest.mark.chaos


async def test_an_ordered_batch_keeps_its_order_through_two_brain_sigkills(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    # Given a Brain that dies right after it committed the batch's manifest (the first call's
    # command not sent), and the next one right after it committed the first call's success (and
    # with it the admission of the second, whose command it may not have sent)
    env = world(tendon, tmp_path)
    await processes.start_ready("hands", HANDS, env)
    items = [{"n": i, "delay": 0.05} for i in range(5)]
    for kill_at in ("brain.after_intent_commit@call-1#0", "brain.after_apply_commit@succeeded"):
        brain = await processes.start_ready("brain", BRAIN, {**env, "TENDON_KILL_AT": kill_at})
        if kill_at.startswith("brain.after_intent"):
            turn_id = await submit(env, tmp_path, {"tool": "step", "items": items, "mode": "ordered"})
        assert await processes.wait_exit(brain) == -signal.SIGKILL

    # When a third Brain takes over
    await processes.start_ready("brain", BRAIN, env)
    obs = Observer(tendon)
    await obs.wait_turn(turn_id, "completed", timeout=60)

    # Then the calls ran one at a time, in order, each once
    log = events(tmp_path / "log")
    assert [n for what, _, n, _ in log if what == "start"] == list(range(5))
    assert most_at_once(log) == 1
    batch = await batch_row(obs, turn_id)
    assert effects(log) == Counter(child_id(batch["id"], i) for i in range(5))
    assert [c["status"] for c in batch["result"]["calls"]] == ["succeeded"] * 5
    assert len(await obs.facts(turn_id, "batch.accepted")) == 1  # one manifest, never made again


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
