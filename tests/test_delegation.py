"""Delegation with real Brain processes on PostgreSQL: a lead agent delegates to two sub-agents at
once and its Brain is SIGKILLed right after the children were accepted: the next Brain finds the
record, starts no second child, and the lead completes with both answers; a cancel that came
before a child was accepted leaves a record, so no child starts late; a child over its time budget
ends with its partial result; `brain history` of the lead shows each child's cost, added up.
(Two Brains, and a cancel reaching running tools: ``test_delegation_brains``.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import Observer, Processes, TendonEnv, run_cli, wait_for

BRAIN = ["-m", "brain", "serve"]

pytestmark = pytest.mark.chaos


def sub(name: str, script: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"name": name, "version": "1", "model": {"kind": "scripted", "script": script}, **fields}


class World:
    def __init__(self, tendon: TendonEnv, processes: Processes, tmp_path: Path) -> None:
        self.env, self.processes, self.tmp = tendon.env, processes, tmp_path
        self.obs = Observer(tendon)

    async def brain(self, *args: str) -> tuple[int, str, str]:
        return await run_cli(["-m", "brain", *args], self.env)

    async def submit(self, name: str, delegates: dict[str, Any], calls: list[dict[str, Any]]) -> str:
        script = [{"tool_calls": calls}, {"content": "answers:\n{results}"}]
        path = self.tmp / f"{name}.json"
        path.write_text(json.dumps(sub(name, script, delegates=delegates)))
        code, out, err = await self.brain(
            "submit", "--session", name, "--request-id", name, "--agent", str(path), "go"
        )
        assert code == 0, err
        return out.strip()

    async def records(self, turn_id: str, count: int) -> list[Any]:
        async def there() -> Any:
            rows = await self.obs.fetch(
                "SELECT * FROM {brain}.delegations WHERE parent_turn_id = $1 ORDER BY call_id", turn_id
            )
            return rows if len(rows) == count else None

        return await wait_for(there, timeout=30, what=f"{count} delegation record(s) of {turn_id}")

    async def children(self) -> list[Any]:
        return await self.obs.fetch("SELECT * FROM {brain}.turns WHERE request_id LIKE 'delegate:%'")


@pytest.fixture
def world(tendon: TendonEnv, processes: Processes, tmp_path: Path) -> World:
    return World(tendon, processes, tmp_path)


async def test_a_brain_killed_after_its_children_were_accepted_starts_no_second_child(world: World) -> None:
    # Given a lead delegating to two sub-agents at once, and a Brain that dies right after the
    # commit that accepted the children
    delegates = {
        "research": {"agent": sub("researcher", [{"content": "found it"}])},
        "review": {"agent": sub("reviewer", [{"content": "looks right"}]), "thread": "reviews"},
    }
    calls = [{"tool": "research", "args": {"input": "look"}}, {"tool": "review", "args": {"input": "check"}}]
    doomed = await world.processes.start_ready(
        "brain", BRAIN, {**world.env, "TENDON_KILL_AT": "brain.after_child_accepted"}
    )
    turn = await world.submit("lead", delegates, calls)
    assert await world.processes.wait_exit(doomed) == -9
    accepted = await world.records(turn, 2)
    assert all(r["status"] == "running" and r["child_turn_id"] for r in accepted)

    # When another Brain starts
    await world.processes.start_ready("brain2", BRAIN, world.env)

    # Then the lead completes with both answers, from exactly the two children the record names
    done = await world.obs.wait_turn(turn, "completed")
    assert "found it" in done["result"]["text"] and "looks right" in done["result"]["text"]
    kids = await world.children()
    assert sorted(k["id"] for k in kids) == sorted(r["child_turn_id"] for r in accepted)
    assert {k["status"] for k in kids} == {"completed"}
    delegated = await world.obs.facts(turn, "turn.delegated")
    assert sorted(f["child_turn"] for f in delegated) == sorted(k["id"] for k in kids)

    # And `brain history` of the lead shows each child's cost, and the sum
    code, out, err = await world.brain("history", turn, "--json")
    assert code == 0, err
    history = json.loads(out)
    assert [c["usage"]["model_calls"] for c in history["children"]] == [1, 1]
    assert history["usage"] == {"model_calls": 4, "steps": 4}  # the lead's 2 replies, one per child


async def test_a_cancel_before_the_child_was_accepted_leaves_a_record_and_no_child(world: World) -> None:
    # Given a lead whose Brain dies before it accepts the child (nothing of that commit lands)
    delegates = {"research": {"agent": sub("researcher", [{"content": "late"}])}}
    doomed = await world.processes.start_ready(
        "brain", BRAIN, {**world.env, "TENDON_KILL_AT": "brain.before_child_accepted"}
    )
    turn = await world.submit("lead", delegates, [{"tool": "research", "args": {"input": "x"}}])
    assert await world.processes.wait_exit(doomed) == -9

    # When the lead is cancelled, then a Brain starts
    code, out, err = await world.brain("cancel", turn)
    assert code == 0, err
    await world.obs.wait_turn(turn, "cancelled")
    await world.processes.start_ready("brain2", BRAIN, world.env)

    # Then the call's record says no child was started, and none ever is
    (record,) = await world.records(turn, 1)
    assert record["status"] == "never_started" and record["child_turn_id"] is None
    assert "cancelled before its child was accepted" in record["reason"]
    assert await world.children() == []


async def test_a_child_over_its_time_budget_ends_with_its_partial_result(world: World) -> None:
    # Given a child that sleeps far longer than its budget of 1 s allows
    await world.processes.start_ready("brain", BRAIN, world.env)
    nap = [{"tool_calls": [{"tool": "sleep", "args": {"seconds": 300}}]}, {"content": "woke"}]
    sleeper = sub("sleeper", nap, tools=["sleep"])
    delegates = {"nap": {"agent": sleeper, "budget": {"seconds": 1}, "on_budget": "partial"}}
    turn = await world.submit("lead", delegates, [{"tool": "nap", "args": {"input": "x"}}])

    # Then the child is cancelled once its time is spent, and the lead's call takes what it had
    await world.obs.wait_turn(turn, "completed", timeout=30)
    (record,) = await world.records(turn, 1)
    assert record["status"] == "settled" and "time budget" in record["reason"]
    assert await world.obs.turn_status(record["child_turn_id"]) == "cancelled"
    (call,) = await world.obs.executions(turn)
    assert (call["status"], call["how"], call["result"]["partial"]) == ("succeeded", "partial", True)
    (asked,) = await world.obs.facts(turn, "tool.child_cancel_requested")
    assert asked["child_turn"] == record["child_turn_id"]
