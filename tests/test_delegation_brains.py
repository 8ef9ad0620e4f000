"""Delegation with real processes on PostgreSQL: two Brains start each child once; cancelling the
lead cancels both of its children and their running tools, on a real Hands pool."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support import Processes, TendonEnv, wait_for
from tests.test_delegation import BRAIN, World, sub

pytestmark = pytest.mark.chaos


@pytest.fixture
def world(tendon: TendonEnv, processes: Processes, tmp_path: Path) -> World:
    return World(tendon, processes, tmp_path)


async def ran(path: Path, words: str, count: int) -> bool:
    return await asyncio.to_thread(lambda: path.exists() and path.read_text().count(words) == count)


async def test_two_brains_start_each_child_once(world: World) -> None:
    # Given two Brains, and three leads that each delegate to two sub-agents at once
    for name in ("brain1", "brain2"):
        await world.processes.start_ready(name, BRAIN, world.env)
    delegates = {
        "a": {"agent": sub("alpha", [{"content": "from alpha"}])},
        "b": {"agent": sub("beta", [{"content": "from beta"}])},
    }
    calls = [{"tool": "a", "args": {"input": "x"}}, {"tool": "b", "args": {"input": "y"}}]
    turns = [await world.submit(f"lead{i}", delegates, calls) for i in range(3)]

    # Then each completes with both answers, from exactly one child per call
    for turn in turns:
        done = await world.obs.wait_turn(turn, "completed")
        assert "from alpha" in done["result"]["text"] and "from beta" in done["result"]["text"]
        assert len(await world.obs.facts(turn, "turn.delegated")) == 2
        assert len(await world.obs.facts(turn, "tool.delegated")) == 2
    assert len(await world.children()) == 6


async def test_cancelling_the_lead_cancels_both_children_and_their_running_tools(
    world: World, tendon: TendonEnv
) -> None:
    # Given a Brain, a Hands pool, and a lead whose two children each run a tool that waits
    runs = world.tmp / "runs.txt"
    env = {**world.env, "BULK_RUNS_FILE": str(runs)}
    tendon.routes.add("bulk")
    await world.processes.start_ready("brain", BRAIN, env)
    hands = ["-m", "hands", "serve", "--route", "bulk", "--tools", "tests.brain_e2e_tools"]
    await world.processes.start_ready("hands", hands, env)
    step = {"tool_calls": [{"tool": "slow_step", "args": {"seconds": 120, "gate": str(world.tmp / "never")}}]}
    busy = sub("busy", [step, {"content": "done"}], tools=["slow_step"])
    delegates = {"a": {"agent": busy}, "b": {"agent": {**busy, "name": "busy2"}}}
    turn = await world.submit(
        "lead", delegates, [{"tool": "a", "args": {"input": "x"}}, {"tool": "b", "args": {"input": "y"}}]
    )
    await wait_for(lambda: ran(runs, "started", 2), timeout=30, what="both children's tools running")

    # When the lead is cancelled
    code, out, err = await world.brain("cancel", turn)
    assert code == 0, err

    # Then both children end cancelled, their tools stopped by their own cancels, and the lead's
    # stream says it asked
    await world.obs.wait_turn(turn, "cancelled")
    records = await world.records(turn, 2)
    for r in records:
        await world.obs.wait_turn(r["child_turn_id"], "cancelled")
    await wait_for(lambda: ran(runs, "stopped by a cancel", 2), timeout=30, what="both tools stopped")
    asked = await world.obs.facts(turn, "tool.child_cancel_requested")
    assert sorted(f["child_turn"] for f in asked) == sorted(r["child_turn_id"] for r in records)
