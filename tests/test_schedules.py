"""Schedules with real Brain processes on PostgreSQL: a schedule every second with two Brains
running fires each second once (never twice, whichever Brain looks first), and the times missed
while every Brain was SIGKILLed fire once, late, after a restart, saying so."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from brain.rules.submits import session_key
from tests.support import Observer, Processes, TendonEnv, run_cli, wait_for

BRAIN = ["-m", "brain", "serve"]

pytestmark = pytest.mark.chaos


async def accepted(obs: Observer, session: str) -> list[dict[str, Any]]:
    """The accepted facts of the session's turns, in order."""
    key = session_key("default", session)  # the store keys a session by its namespace too
    rows = await obs.fetch("SELECT facts FROM {brain}.journal WHERE session_id = $1 ORDER BY seq", key)
    return [f for r in rows for f in r["facts"] if f["kind"] == "turn.accepted"]


async def test_a_schedule_every_second_fires_once_per_second_with_two_brains_and_once_late_after_a_restart(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    obs = Observer(tendon)
    agent = tmp_path / "ticker.json"
    script = [{"content": "tick"}]
    agent.write_text(
        json.dumps({"name": "ticker", "version": "1", "model": {"kind": "scripted", "script": script}})
    )
    brains = [await processes.start_ready(f"brain{i}", BRAIN, tendon.env) for i in (1, 2)]

    # Given a schedule every second, made with `brain schedule add`, and two Brains running
    code, out, err = await run_cli(
        ["-m", "brain", "schedule", "add", "--session", "ticks", "--agent", str(agent),
         "--cron", "* * * * * *", "--request-id", "ticks", "--json", "tick"], tendon.env,
    )  # fmt: skip
    assert code == 0, err
    schedule = json.loads(out)

    async def fired(n: int) -> Any:
        facts = await accepted(obs, "ticks")
        return facts if len(facts) >= n else None

    await wait_for(lambda: fired(4), timeout=30, what="four ticks")

    # When every Brain is SIGKILLed, and stays down for three seconds
    for brain in brains:
        brain.kill()
    for brain in brains:
        assert await processes.wait_exit(brain) == -9
    before = await accepted(obs, "ticks")
    await asyncio.sleep(3)
    assert len(await accepted(obs, "ticks")) == len(before)
    await processes.start_ready("brain3", BRAIN, tendon.env)
    await wait_for(lambda: fired(len(before) + 3), timeout=30, what="ticks after the restart")

    # Then each second fired once: no time twice, and the times fired and missed cover every
    # second from the first to the last
    facts = await accepted(obs, "ticks")
    dues = [datetime.fromisoformat(f["schedule"]["due_at"]) for f in facts]
    assert len(set(dues)) == len(dues) and dues == sorted(dues)
    assert all(f["schedule"]["id"] == schedule["id"] for f in facts)
    missed = sum(f["schedule"].get("missed", 0) for f in facts)
    assert len(dues) + missed == int((dues[-1] - dues[0]).total_seconds()) + 1
    # ...and the time missed while no Brain ran fired once, late, saying how many it missed
    late = [f["schedule"] for f in facts[len(before) :] if "late_seconds" in f["schedule"]]
    assert late and late[0]["late_seconds"] >= 2 and late[0]["missed"] >= 2
    turns = await obs.fetch("SELECT request_id FROM {brain}.turns WHERE session_id = 'default/ticks'")
    assert len(turns) == len(facts)
