"""Retention on real processes (PostgreSQL, RabbitMQ, S3): what is finished goes after its
horizon, what is not stays, and a pruned record never lets a side effect run again or a reader
lose events silently.

Horizons here are seconds (``TENDON_RETAIN_*_DAYS`` take fractions), so pruning runs every
quarter of one."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from protocol import new_timed_id
from tests import hands_test_tools as lab
from tests.hands_bus import Bus, command, ledger_fetch, runs, start_worker
from tests.support import Processes, TendonEnv, free_port, wait_for

pytestmark = pytest.mark.chaos

HORIZON = 2.0  # seconds
DAYS = f"{HORIZON / 86400:.12f}"


async def _ledger_ids(world: TendonEnv) -> set[str]:
    return {r["execution_id"] for r in await ledger_fetch(world, "SELECT execution_id FROM executions")}


async def test_finished_executions_are_pruned_and_a_late_copy_of_an_unsafe_command_is_not_run_again(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a pool that keeps finished executions for 2 s
    await start_worker(processes, world, TENDON_RETAIN_LEDGER_DAYS=DAYS)
    paged = command(lab.slow, {"pages": 2, "delay": 0.01}, execution_id=f"exe-{new_timed_id()}")
    unsafe = command(lab.charge_noquery, {"amount": 7}, execution_id=f"exe-{new_timed_id()}")
    for cmd in (paged, unsafe):
        await bus.publish_command(cmd)
        await bus.wait_kind(cmd.execution_id, "succeeded")
    # and one that is still running when they are pruned
    running = command(lab.slow, {"pages": 1, "delay": 2.5 * HORIZON}, execution_id=f"exe-{new_timed_id()}")
    await bus.publish_command(running)
    await bus.wait_kind(running.execution_id, "started")

    # When the horizon passes, the finished ones go with their output; the running one stays
    async def pruned() -> bool:
        return not {paged.execution_id, unsafe.execution_id} & await _ledger_ids(world)

    await wait_for(pruned, timeout=6 * HORIZON, what="the finished executions to be pruned")
    chunks = await ledger_fetch(
        world, "SELECT count(*) AS n FROM output_chunks WHERE execution_id = $1", paged.execution_id
    )
    assert chunks[0]["n"] == 0
    assert running.execution_id in await _ledger_ids(world)

    # And a late copy of the unsafe command (its row gone, so its absence proves nothing) is not
    # run again: it is UNKNOWN, for a person to reconcile
    await bus.publish_command(unsafe)
    late = await bus.wait_kind(unsafe.execution_id, "unknown")
    assert "older than this pool's ledger keeps" in late.body.reason
    # which retention never prunes, however long it waits
    await asyncio.sleep(1.5 * HORIZON)
    (row,) = await ledger_fetch(
        world, "SELECT status FROM executions WHERE execution_id = $1", unsafe.execution_id
    )
    assert row["status"] == "unknown"
    # The running tool finished and was pruned in its turn; the unsafe one ran once in all
    await bus.wait_kind(running.execution_id, "succeeded")
    assert [r for r in runs(world) if r[0] == "charge_noquery"] == [
        ("charge_noquery", unsafe.execution_id, 1)
    ]


# ---- the journal, through the HTTP API ----------------------------------------------------

BRAIN = ["-m", "brain", "serve"]
HANDS_BULK = ["-m", "hands", "serve", "--route", "bulk", "--tools", "tests.brain_e2e_tools"]
AGENT = {
    "name": "retained",
    "version": "1",
    "tools": ["slow_step"],
    "model": {
        "kind": "scripted",
        "script": [{"tool_calls": [{"tool": "slow_step", "args": {"seconds": 0.05}}]}, {"content": "done"}],
    },
}


async def _stream(url: str, session: str, seen: list[tuple[str, Any]]) -> None:
    """Follow a session's stream from the start, noting each (event kind, data)."""
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(None, connect=10)) as http:
        async with http.stream("GET", f"/v1/sessions/{session}/stream", params={"cursor": 0}) as response:
            assert response.status_code == 200
            kind = None
            async for line in response.aiter_lines():
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:") and kind in ("entry", "resync"):
                    seen.append((kind, json.loads(line[5:])))


async def test_the_journal_of_a_closed_session_is_pruned_and_its_readers_are_told_never_left_silent(
    tendon: TendonEnv, processes: Processes
) -> None:
    # Given a Brain that keeps the journal of closed sessions for 2 s
    tendon.routes.add("bulk")
    port = free_port()
    env = {**tendon.env, "TENDON_HTTP": f"127.0.0.1:{port}", "TENDON_RETAIN_JOURNAL_DAYS": DAYS}
    await processes.start_ready("brain", BRAIN, env)
    await processes.start_ready("hands", HANDS_BULK, env)
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        turns = {}
        for session in ("s-closed", "s-open"):
            body = {"request_id": "r1", "input": "go", "agent": AGENT}
            turns[session] = (await http.post(f"/v1/sessions/{session}/turns", json=body)).json()["turn_id"]
            done = await http.get(f"/v1/turns/{turns[session]}", params={"wait": "30"})
            assert done.json()["status"] == "completed"
        whole = (await http.get("/v1/sessions/s-closed/events")).json()["events"]
        # and a reader following the session that will be closed
        seen: list[tuple[str, Any]] = []
        reader = asyncio.create_task(_stream(url, "s-closed", seen))
        try:
            await wait_for(
                lambda: asyncio.sleep(0, len(seen) >= len(whole)), timeout=10, what="the reader to catch up"
            )

            # When the session is closed and the horizon passes
            assert (await http.post("/v1/sessions/s-closed/close")).json() == {"closed": True}

            # Then, once the horizon has passed, a cursor into what was pruned answers 410
            async def pruned() -> bool:
                page = await http.get("/v1/sessions/s-closed/events", params={"cursor": 0})
                return page.status_code == 410

            await wait_for(pruned, timeout=6 * HORIZON, what="the closed session's journal to be pruned")
            await asyncio.sleep(1.0)  # a few more looks of the reader at the journal
        finally:
            reader.cancel()
        # A reader that had seen everything lost nothing (it is not behind what was pruned)
        assert [data["seq"] for kind, data in seen if kind == "entry"] == [e["seq"] for e in whole]
        assert not [data for kind, data in seen if kind == "resync"]
        # a cursor into what was pruned answers 410, on the page and on the stream
        gone = await http.get("/v1/sessions/s-closed/events", params={"cursor": 0})
        assert gone.status_code == 410 and "snapshot" in gone.json()["error"]["message"]
        assert (await http.get("/v1/sessions/s-closed/stream", params={"cursor": 0})).status_code == 410
        # while the turn itself, and the snapshot, still say how it ended
        snapshot = (await http.get("/v1/sessions/s-closed/snapshot")).json()
        assert snapshot["cursor"] == whole[-1]["seq"]
        assert [t["status"] for t in snapshot["turns"]] == ["completed"]
        turn = (await http.get(f"/v1/turns/{turns['s-closed']}")).json()
        assert turn["result"] == {"text": "done"}
        # And the open session keeps all of its journal
        kept = (await http.get("/v1/sessions/s-open/events")).json()["events"]
        assert kept and kept[0]["seq"] == 1
