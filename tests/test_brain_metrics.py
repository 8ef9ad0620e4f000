"""The Brain's metrics count what the record holds: every turn that ended is in
``tendon_turn_seconds`` by how it ended (a cancel applied by the request itself, or at a run's
boundary, included), and an execution whose outcome came twice in one apply is measured once in
``tendon_tool_seconds``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from brain.run.runs import Scheduler, Wakeups
from brain.run.updates import UpdateConsumer
from brain.store import BrainStore
from infra.process.killpoints import KillPoints
from infra.process.settings import Settings
from infra.transport import Topology
from infra.transport.localqueue import LocalBroker
from local.embedded import DataDir, run_local
from tests.support import free_port, wait_for
from tests.test_brain_claims import _context
from tests.test_brain_store import _events, _submit, _waiting_on, store

__all__ = ["store"]  # the fixture, used by name


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample of Prometheus' text format (0 when it is not there)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        if (
            key.split("{")[0] == name
            and ",".join(sorted(key.partition("{")[2].rstrip("}").split(","))) == want
        ):
            return float(value)
    return 0.0


def slow(name: str, gate: Path) -> dict[str, Any]:
    call = {"tool": "slow_step", "args": {"seconds": 60, "gate": str(gate)}}
    script = [{"tool_calls": [call]}, {"content": "done"}]
    return {
        "name": name,
        "version": "1",
        "tools": ["slow_step"],
        "model": {"kind": "scripted", "script": script},
    }


async def test_cancelled_turns_are_measured_whether_the_cancel_ended_them_at_once_or_at_a_boundary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BULK_RUNS_FILE", str(tmp_path / "runs.txt"))
    port = free_port()
    settings = Settings(scan_interval=0.2, http=f"127.0.0.1:{port}")
    pools = [("bulk", "tests.brain_e2e_tools")]
    async with run_local(settings, DataDir(tmp_path / "data"), pools=pools, killpoints=KillPoints()):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            await wait_for(lambda: _answers(http), timeout=30, what="the API")
            # Given a turn whose tool runs, and one that waits for a tool no pool announced
            running = await _turn(http, "s-run", slow("slow-a", tmp_path / "never"))
            await wait_for(lambda: _running(http, running), timeout=30, what="the tool to run")
            idle = await _turn(
                http,
                "s-idle",
                {
                    **slow("slow-b", tmp_path / "never"),
                    "tools": ["nobody_serves"],
                    "expect_tools": ["nobody_serves"],
                },
            )
            await wait_for(lambda: _status(http, idle, "waiting"), timeout=30, what="the wait for bindings")
            # When both are cancelled: the running one once its tool stopped (at its boundary),
            # the idle one by the cancel's own commit
            assert (await _control(http, running, "cancel"))["status"] == "received"
            assert (await _control(http, idle, "cancel"))["status"] == "applied"
            for turn in (running, idle):
                await wait_for(lambda t=turn: _status(http, t, "cancelled"), timeout=30, what="the cancel")
            # Then both are measured as cancelled turns
            text = (await http.get("/metrics")).text
    counts = [line for line in text.splitlines() if line.startswith("tendon_turn_seconds_count")]
    assert sample(text, "tendon_turn_seconds_count", status="cancelled") == 2, counts


async def _answers(http: httpx.AsyncClient) -> bool:
    try:
        return (await http.get("/openapi.json")).status_code == 200
    except httpx.TransportError:
        return False


async def _turn(http: httpx.AsyncClient, session: str, agent: dict[str, Any]) -> str:
    answer = await http.post(
        f"/v1/sessions/{session}/turns", json={"request_id": "r", "input": "go", "agent": agent}
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["turn_id"])


async def _control(http: httpx.AsyncClient, turn: str, kind: str) -> dict[str, Any]:
    return (await http.post(f"/v1/turns/{turn}/controls", json={"kind": kind})).json()  # type: ignore[no-any-return]


async def _status(http: httpx.AsyncClient, turn: str, wanted: str) -> bool:
    return (await http.get(f"/v1/turns/{turn}")).json()["status"] == wanted  # type: ignore[no-any-return]


async def _running(http: httpx.AsyncClient, turn: str) -> bool:
    executions = (await http.get(f"/v1/turns/{turn}/executions")).json()
    return bool(executions) and executions[0]["status"] == "running"


async def test_an_outcome_that_came_twice_in_one_apply_is_measured_once(
    store: BrainStore, tmp_path: Path
) -> None:
    # Given a turn waiting on one execution
    await _waiting_on(store, await _submit(store), "e1")
    events = list(_events("e1"))
    async with LocalBroker(tmp_path / "queues.sqlite3", Topology("t")) as transport:
        ctx = _context(store, transport)
        consumer = UpdateConsumer(ctx, transport, Scheduler(ctx, 10, Wakeups(), 1.0))
        # When its events come twice (a delivery and a redelivery) and are applied together
        results = await store.transact(lambda conn: consumer._apply(conn, [events, list(events)]))
    # Then the execution ended once
    ended = [tool for result in results for tool in result[1]]
    assert [(t.tool, t.status) for t in ended] == [("echo", "succeeded")]
