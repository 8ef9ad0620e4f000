"""Durable waits with real Brain processes on PostgreSQL: a sleeping turn is a row, so a Brain
SIGKILLed while it sleeps loses nothing and the next one wakes it on time; a signal sent with
`brain signal` wakes its wait, and a wait whose signal never comes times out. No Hands pool runs:
the built-in tools are the Brain's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import Observer, Processes, TendonEnv, run_cli, wait_for

BRAIN = ["-m", "brain", "serve"]
SCAN = 0.2  # TENDON_SCAN_INTERVAL of the test world
EXIT_REJECTED = 6

pytestmark = pytest.mark.chaos


class World:
    def __init__(self, tendon: TendonEnv, processes: Processes, tmp_path: Path) -> None:
        self.env, self.processes, self.tmp = tendon.env, processes, tmp_path
        self.obs = Observer(tendon)
        self.n = 0

    async def brain(self, *args: str) -> tuple[int, str, str]:
        return await run_cli(["-m", "brain", *args], self.env)

    async def submit(self, calls: list[dict[str, Any]], tools: list[str]) -> str:
        self.n += 1
        script = [{"tool_calls": calls}, {"content": "{results}"}]
        path = self.tmp / f"agent{self.n}.json"
        path.write_text(json.dumps({"name": f"w{self.n}", "version": "1", "tools": tools,
                                    "model": {"kind": "scripted", "script": script}}))  # fmt: skip
        code, out, err = await self.brain("submit", "--session", f"s{self.n}", "--request-id", f"r{self.n}",
                                          "--agent", str(path), "go")  # fmt: skip
        assert code == 0, err
        return out.strip()

    async def waiting(self, turn_id: str) -> Any:
        async def pending() -> Any:
            rows = await self.obs.executions(turn_id)
            return rows[0] if rows and rows[0]["status"] == "pending" else None

        return await wait_for(pending, timeout=30, what=f"the wait of {turn_id}")


@pytest.fixture
def world(tendon: TendonEnv, processes: Processes, tmp_path: Path) -> World:
    return World(tendon, processes, tmp_path)


async def test_a_sleeping_turn_survives_a_killed_brain_and_wakes_on_time(world: World) -> None:
    # Given a turn that sleeps 3 s, and its Brain SIGKILLed while it sleeps
    brain = await world.processes.start_ready("brain", BRAIN, world.env)
    turn = await world.submit([{"tool": "sleep", "args": {"seconds": 3}}], ["sleep"])
    sleeping = await world.waiting(turn)
    assert (sleeping["how"], sleeping["route"]) == ("awaiting_clock", "brain")
    brain.kill()
    assert await world.processes.wait_exit(brain) == -9

    # When another Brain starts
    await world.processes.start_ready("brain", BRAIN, world.env)
    (up,) = await world.obs.fetch("SELECT now() AS t")

    # Then the sleep ends on time: within the scan interval (give or take a busy machine) of its
    # end, or of the new Brain's start when that came later; the turn goes on from its row
    await world.obs.wait_turn(turn, "completed")
    (row,) = await world.obs.executions(turn)
    assert (row["status"], row["how"]) == ("succeeded", "slept")
    slept = (row["updated_at"] - row["created_at"]).total_seconds()
    due = max(3.0, (up["t"] - row["created_at"]).total_seconds())
    assert 3.0 <= slept < due + SCAN + 1.0, (slept, due)
    assert row["result"]["slept"] >= 3.0 and row["wait_until"] is None


async def test_brain_signal_wakes_its_wait_and_an_unsignalled_wait_times_out(world: World) -> None:
    await world.processes.start_ready("brain", BRAIN, world.env)
    # Given a turn that waits for x.go forever, and one that waits 1 s for a signal never sent
    forever = await world.submit([{"tool": "wait_for_signal", "args": {"key": "x.go"}}], ["wait_for_signal"])
    brief = await world.submit(
        [{"tool": "wait_for_signal", "args": {"key": "x.go", "timeout": 1}}], ["wait_for_signal"]
    )

    # Then the brief one times out by the clock, and the model is told so
    await world.obs.wait_turn(brief, "completed")
    (row,) = await world.obs.executions(brief)
    assert (row["how"], row["result"]["timed_out"]) == ("timed_out", True)

    # When `brain signal` sends another key, it is kept for a later wait and this one goes on
    await world.waiting(forever)
    code, out, err = await world.brain("signal", forever, "x.stop", "--json")
    assert code == 0 and json.loads(out)["status"] == "received", err
    assert await world.obs.turn_status(forever) == "waiting"

    # When it sends x.go with a payload, the wait gets it and the turn completes
    code, out, err = await world.brain(
        "signal", forever, "x.go", '{"n": 1}', "--request-id", "sig-1", "--json"
    )
    assert code == 0, err
    receipt = json.loads(out)
    assert (receipt["kind"], receipt["status"]) == ("signal", "applied")
    done = await world.obs.wait_turn(forever, "completed")
    (row,) = await world.obs.executions(forever)
    assert (row["how"], row["result"]) == (
        "signalled",
        {"key": "x.go", "payload": {"n": 1}, "timed_out": False},
    )
    assert '"payload": {"n": 1}' in done["result"]["text"]

    # The same request again answers the original receipt; a signal to an ended turn is rejected
    code, again, err = await world.brain(
        "signal", forever, "x.go", '{"n": 1}', "--request-id", "sig-1", "--json"
    )
    assert code == 0 and json.loads(again) == receipt, err
    code, late, err = await world.brain("signal", forever, "x.go", "--json")
    assert code == EXIT_REJECTED and "completed already" in json.loads(late)["reason"], err
    kinds = [f["kind"] for f in await world.obs.facts(forever)]
    assert kinds.count("control.applied") == 1 and "execution.succeeded" in kinds

    # ...and the kept x.stop, which no call waited for, is rejected once the turn ended
    async def stop_rejected() -> Any:
        rows = await world.obs.fetch("SELECT status FROM {brain}.controls WHERE body ->> 'key' = 'x.stop'")
        return rows and rows[0]["status"] == "rejected"

    await wait_for(stop_rejected, timeout=10, what="the kept signal rejected")


async def test_two_brains_answer_each_sleep_once(world: World) -> None:
    # Given two Brains, and turns that each sleep a second
    for name in ("brain1", "brain2"):
        await world.processes.start_ready(name, BRAIN, world.env)
    turns = [await world.submit([{"tool": "sleep", "args": {"seconds": 1}}], ["sleep"]) for _ in range(6)]

    # Then every turn completes, and each sleep was answered once (one fact, one commit)
    for turn in turns:
        await world.obs.wait_turn(turn, "completed")
        outcomes = [f for f in await world.obs.facts(turn) if f["kind"].startswith("execution.succeeded")]
        assert [f["how"] for f in outcomes] == ["slept"], outcomes
