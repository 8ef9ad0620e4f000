"""The agent runtime on the embedded backend (SQLite, the local queue, a directory object store,
all in this process): the same verbs and controls as the distributed mode, through
``local.embedded.run_local``. Pause and resume while a tool runs, cancel of a running tool,
steer, approvals and manual tools, threads, and the retry policy with a scripted model."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from brain import verbs
from brain.rules.agents import AgentDefinition
from brain.rules.controls import Kind
from brain.verbs import controls
from brain.verbs.describe import describe
from infra.process.killpoints import KillPoints
from infra.process.settings import Settings
from infra.transport import Topology
from local.embedded import DataDir, LocalSystem, run_local
from tests.support import wait_for

NS = "default"


@asynccontextmanager
async def started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalSystem]:
    monkeypatch.setenv("BULK_RUNS_FILE", str(tmp_path / "runs.txt"))
    settings = Settings(scan_interval=0.2, reconnect_grace=0.5, lease_seconds=10, http="off")
    async with run_local(
        settings,
        DataDir(tmp_path / "data"),
        pools=[("bulk", "tests.brain_e2e_tools")],
        killpoints=KillPoints(),
    ) as running:
        yield running


@pytest.fixture
async def system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalSystem]:
    async with started(tmp_path, monkeypatch) as running:
        yield running


def agent(name: str, script: list[dict[str, Any]], **fields: Any) -> AgentDefinition:
    fields.setdefault("tools", ["slow_step"])
    return AgentDefinition.model_validate(
        {"name": name, "version": "1", "model": {"kind": "scripted", "script": script}, **fields}
    )


async def submit(system: LocalSystem, definition: AgentDefinition, request: str, thread: str = "main") -> str:
    turn_id, _ = await verbs.submit(
        system.brain, namespace=NS, session_id="s", request_id=request, user_input="go",
        agent=definition, wake_channel=system.wake_channel, thread=thread,
        tools=verbs.KnownTools(served=system.served),
    )  # fmt: skip
    return turn_id


async def control(system: LocalSystem, turn_id: str, kind: Kind, request: str, **extra: Any) -> Any:
    return await controls.control(
        system.brain, namespace=NS, turn_id=turn_id, request_id=request, kind=kind,
        topology=Topology(Settings().queue_prefix), wake_channel=system.wake_channel, **extra,
    )  # fmt: skip


async def status(system: LocalSystem, turn_id: str, wanted: str, timeout: float = 30) -> dict[str, Any]:
    async def reached() -> Any:
        d = await describe(system.brain, NS, turn_id)
        return d if d["status"] == wanted else None

    return await wait_for(reached, timeout=timeout, what=f"turn {turn_id} to be {wanted}")


async def execution(system: LocalSystem, turn_id: str, wanted: str) -> dict[str, Any]:
    async def reached() -> Any:
        d = await describe(system.brain, NS, turn_id)
        found = [e for e in d["executions"] if e["status"] == wanted]
        return found[0] if found else None

    return await wait_for(reached, timeout=30, what=f"an execution of {turn_id} to be {wanted}")


async def test_pause_resume_and_a_stale_resume_on_the_embedded_backend(system: LocalSystem) -> None:
    slow = agent(
        "slow", [{"tool_calls": [{"tool": "slow_step", "args": {"seconds": 1}}]}, {"content": "done"}]
    )
    turn = await submit(system, slow, "r1")
    await execution(system, turn, "running")
    assert (await control(system, turn, Kind.PAUSE, "p")).status == "applied"
    await execution(system, turn, "succeeded")
    shown = await status(system, turn, "paused")
    stale = await control(system, turn, Kind.RESUME, "r-old", revision=shown["revision"] - 1)
    assert stale.status == "rejected"
    assert (await control(system, turn, Kind.RESUME, "r", revision=shown["revision"])).status == "applied"
    assert (await status(system, turn, "completed"))["result"] == {"text": "done"}


async def test_cancel_stops_a_running_tool_on_the_embedded_backend(
    system: LocalSystem, tmp_path: Path
) -> None:
    turn = await submit(
        system, agent("long", [{"tool_calls": [{"tool": "slow_step", "args": {"seconds": 60}}]}]), "r"
    )
    running = await execution(system, turn, "running")
    assert (await control(system, turn, Kind.CANCEL, "c")).status == "received"
    await status(system, turn, "cancelled")
    runs = (tmp_path / "runs.txt").read_text().splitlines()
    assert runs == [f"step started {running['id']}", f"step stopped by a cancel {running['id']}"]
    (receipt,) = await controls.receipts(system.brain, namespace=NS, turn_id=turn)
    assert (receipt.kind, receipt.status) == ("cancel", "applied")


async def test_steers_approvals_and_manual_tools_on_the_embedded_backend(system: LocalSystem) -> None:
    manual = [{"name": "ask_person", "input_schema": {"type": "object"}}]
    script = [
        {"delay": 1, "tool_calls": [{"tool": "wire_money", "args": {"amount": 1, "to": "ann"}}]},
        {"tool_calls": [{"tool": "ask_person", "args": {}}]},
        {"content": "{results}"},
    ]
    turn = await submit(system, agent("money", script, tools=["wire_money"], manual_tools=manual), "r")
    await asyncio.sleep(0.3)  # inside the first (slow) model call
    assert (await control(system, turn, Kind.STEER, "s", text="be careful")).status == "received"
    first = await execution(system, turn, "pending")
    approve = await controls.respond(
        system.brain, namespace=NS, turn_id=turn, request_id="a", call=first["call_id"], decision="approve",
        wake_channel=system.wake_channel,
    )  # fmt: skip
    assert approve.status == "applied"
    ask = await wait_for(
        lambda: _pending_other_than(system, turn, first["call_id"]), timeout=30, what="the manual tool's call"
    )
    answer = await controls.respond(
        system.brain, namespace=NS, turn_id=turn, request_id="m", call=ask["call_id"], decision="result",
        result={"ok": True}, wake_channel=system.wake_channel,
    )  # fmt: skip
    assert answer.status == "applied"
    done = await status(system, turn, "completed")
    assert '{"ok": true}' in done["result"]["text"] and '"wired": 1' in done["result"]["text"]
    assert {"role": "steer", "text": "be careful"} in done["history"]


async def _pending_other_than(system: LocalSystem, turn: str, call_id: str) -> Any:
    d = await describe(system.brain, NS, turn)
    found = [e for e in d["executions"] if e["status"] == "pending" and e["call_id"] != call_id]
    return found[0] if found else None


async def test_threads_and_the_retry_budget_on_the_embedded_backend(system: LocalSystem) -> None:
    failing = agent(
        "failing", [{"error": "the model is down"}], tools=[], retry={"max_retries": 2, "initial": 0.1}
    )
    quick = agent("quick", [{"content": "hi"}], tools=[])
    flaky = await submit(system, failing, "r1", thread="a")
    fine = await submit(system, quick, "r2", thread="b")
    assert (await status(system, fine, "completed"))["result"] == {"text": "hi"}
    failed = await status(system, flaky, "failed")
    assert (
        failed["error"]["code"] == "limit_reached" and "gave up after 2 retries" in failed["error"]["message"]
    )
    names = {t["name"]: t for t in await verbs.threads(system.brain, namespace=NS, session_id="s")}
    assert (names["a"]["agent_name"], names["b"]["agent_name"]) == ("failing", "quick")
    assert await verbs.close(system.brain, namespace=NS, session_id="s") is True


async def test_the_embedded_mode_leaves_the_collector_of_its_users_process_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The serve commands freeze their start-up heap (infra.process.heap); a program that embeds Tendon
    # owns its process, and its collector settings stay as it set them.
    before = (gc.get_freeze_count(), gc.get_threshold())
    async with started(tmp_path, monkeypatch) as system:
        turn = await submit(system, agent("hello", [{"content": "hi"}], tools=[]), "r1")
        await status(system, turn, "completed")
    assert (gc.get_freeze_count(), gc.get_threshold()) == before
