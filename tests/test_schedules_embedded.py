"""Schedules on the embedded backend (SQLite, all in this process), and the pure rule of when one
fires: a cron schedule fires each time once into its thread, a paused one not at all, a deleted one
is gone, a once-schedule fires once; a time missed while nothing ran fires once, late, saying so."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from brain import verbs
from brain.rules import schedules as rules
from brain.rules.agents import AgentDefinition
from brain.verbs import schedules
from infra.process.killpoints import KillPoints
from infra.process.settings import Settings
from local.embedded import DataDir, LocalSystem, run_local
from protocol import ConflictError, NotFoundError, SchemaError
from tests.support import wait_for

NS = "default"
AGENT = AgentDefinition.model_validate(
    {"name": "ticker", "version": "1", "model": {"kind": "scripted", "script": [{"content": "tick"}]}}
)


@pytest.fixture
async def system(tmp_path: Path) -> AsyncIterator[LocalSystem]:
    settings = Settings(scan_interval=0.2, reconnect_grace=0.5, lease_seconds=10, http="off")
    async with run_local(settings, DataDir(tmp_path / "data"), pools=[], killpoints=KillPoints()) as running:
        yield running


async def turns(system: LocalSystem, session: str) -> list[dict[str, Any]]:
    try:
        return await verbs.turns(system.brain, namespace=NS, session_id=session, limit=1000)
    except NotFoundError:
        return []


def test_a_missed_time_fires_once_late_and_says_how_many_it_missed() -> None:
    due = datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC)
    on_time = rules.firing("sch-1", "* * * * * *", due, due.replace(microsecond=300_000), tolerance=1.0)
    assert on_time.next_at == due.replace(second=1) and "late_seconds" not in on_time.said
    late = rules.firing(
        "sch-1", "* * * * * *", due, due.replace(second=5, microsecond=500_000), tolerance=1.0
    )
    assert late.next_at == due.replace(second=6)
    assert (late.said["late_seconds"], late.said["missed"]) == (5.5, 5)
    assert late.request_id == "sch-1".join(["schedule:", ":2026-01-01T00:00:00+00:00"])
    once = rules.firing("sch-2", None, due, due, tolerance=1.0)
    assert once.next_at is None
    with pytest.raises(SchemaError):
        rules.check("every day", None)
    with pytest.raises(SchemaError):
        rules.check("* * * * *", 5.0)


async def test_a_schedule_fires_each_second_once_until_paused_and_then_is_deleted(
    system: LocalSystem,
) -> None:
    made = await schedules.create(
        system.brain, namespace=NS, request_id="every-second", session_id="ticks", agent=AGENT, text="tick",
        cron="* * * * * *",
    )  # fmt: skip
    again = await schedules.create(
        system.brain, namespace=NS, request_id="every-second", session_id="ticks", agent=AGENT, text="tick",
        cron="* * * * * *",
    )  # fmt: skip
    assert again["id"] == made["id"] and made["state"] == "active"
    with pytest.raises(ConflictError):
        await schedules.create(
            system.brain, namespace=NS, request_id="every-second", session_id="ticks", agent=AGENT,
            text="tock", cron="* * * * * *",
        )  # fmt: skip

    async def fired_three() -> Any:
        found = await turns(system, "ticks")
        return found if len(found) >= 3 else None

    await wait_for(fired_three, timeout=20, what="three ticks")
    paused = await schedules.change(system.brain, namespace=NS, schedule_id=made["id"], action="pause")
    assert paused["state"] == "paused"
    settled = len(await turns(system, "ticks"))
    (listed,) = await schedules.listed(system.brain, namespace=NS)
    assert listed["fires"] == settled and listed["last_turn_id"] is not None
    # Each turn is one second's: its request id names the time it fired for, and none repeats
    found = await turns(system, "ticks")
    assert len({t["request_id"] for t in found}) == len(found)
    assert all(t["request_id"].startswith(f"schedule:{made['id']}:") for t in found)

    await asyncio.sleep(1.5)
    assert len(await turns(system, "ticks")) == settled  # paused: nothing fires
    with pytest.raises(NotFoundError):
        await schedules.change(system.brain, namespace="elsewhere", schedule_id=made["id"], action="delete")
    gone = await schedules.change(system.brain, namespace=NS, schedule_id=made["id"], action="delete")
    assert gone == {"id": made["id"], "state": "deleted"}
    assert await schedules.listed(system.brain, namespace=NS) == []


async def test_a_once_schedule_fires_once_after_its_delay(system: LocalSystem) -> None:
    made = await schedules.create(
        system.brain, namespace=NS, request_id="once", session_id="later", agent=AGENT, text="now",
        delay=0.5, thread="reminders",
    )  # fmt: skip

    async def done() -> Any:
        (s,) = await schedules.listed(system.brain, namespace=NS)
        return s if s["state"] == "done" else None

    finished = await wait_for(done, timeout=20, what="the once-schedule to fire")
    assert finished["fires"] == 1 and finished["next_at"] is None
    (turn,) = await turns(system, "later")
    assert turn["id"] == finished["last_turn_id"] and made["id"] in turn["request_id"]


async def test_a_time_its_thread_refuses_is_said_on_the_schedule_which_goes_on(system: LocalSystem) -> None:
    # Given a thread pinned to another agent
    other = AgentDefinition.model_validate(
        {"name": "other", "version": "1", "model": {"kind": "scripted", "script": [{"content": "hi"}]}}
    )
    await verbs.submit(system.brain, namespace=NS, session_id="pinned", request_id="first", user_input="hi",
                       agent=other, wake_channel=system.wake_channel)  # fmt: skip

    # When a schedule every second submits into it
    made = await schedules.create(
        system.brain, namespace=NS, request_id="clash", session_id="pinned", agent=AGENT, text="tick",
        cron="* * * * * *",
    )  # fmt: skip

    # Then each time is refused, said on the schedule, and the schedule moves on to the next
    async def refused_twice() -> Any:
        (s,) = await schedules.listed(system.brain, namespace=NS)
        return s if s["fires"] >= 2 else None

    found = await wait_for(refused_twice, timeout=20, what="two refused times")
    assert "pinned to agent other" in found["last_error"] and found["last_turn_id"] is None
    assert found["state"] == "active" and found["id"] == made["id"]
    assert len(await turns(system, "pinned")) == 1
