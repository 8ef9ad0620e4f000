"""The batch executor on the embedded backend (SQLite, a local queue, all in this process): a
batch call runs its children through the Hands pool of their route, bounded and in order, and its
result links each child call with its execution."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from infra.process.settings import Settings
from local.testing import LocalTendon, local_tendon
from tests.batch_tools import events, most_at_once
from tests.support import wait_for


@pytest.fixture
async def tendon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalTendon]:
    monkeypatch.setenv("BATCH_LOG_FILE", str(tmp_path / "log"))
    monkeypatch.setenv("BATCH_DONE_DIR", str(tmp_path))
    async with local_tendon(tmp_path, "tests.batch_tools", settings=Settings(scan_interval=0.2)) as t:
        yield t


def agent(name: str, args: dict[str, Any]) -> dict[str, Any]:
    script = [{"tool_calls": [{"tool": "batch", "args": args}]}, {"content": "done: {results}"}]
    return {"name": name, "version": "1", "tools": ["batch", "step"],
            "model": {"kind": "scripted", "script": script}}  # fmt: skip


async def test_a_parallel_batch_runs_each_item_once_at_most_its_limit_at_once(
    tendon: LocalTendon, tmp_path: Path
) -> None:
    items = [{"n": i, "delay": 0.1} for i in range(8)]
    args = {"tool": "step", "items": items, "mode": "parallel", "limit": 3}
    turn = await tendon.run(agent("fan", args), "go")
    assert turn["status"] == "completed", turn

    log = events(tmp_path / "log")
    starts = sorted(n for what, _, n, _ in log if what == "start")
    assert starts == list(range(8))  # each item ran once
    assert most_at_once(log) <= 3
    (batch,) = [e for e in turn["executions"] if e["tool"] == "batch"]
    assert (batch["status"], batch["how"]) == ("succeeded", "batch")
    calls = batch["result"]["calls"]
    children = {e["id"]: e for e in turn["executions"] if e["tool"] == "step"}
    assert [c["index"] for c in calls] == list(range(8))
    assert {c["execution_id"] for c in calls} == set(children)
    assert all(c["status"] == "succeeded" and c["result"] == {"n": c["index"]} for c in calls)
    assert [c["call_id"] for c in calls] == [f"{batch['call_id']}#{i}" for i in range(8)]
    # The model read one tool message: the batch's
    tools = [m for m in turn["history"] if m["role"] == "tool"]
    assert [m["execution_id"] for m in tools] == [batch["id"]]
    # Each child shows the arguments its item gave it
    assert sorted(e["args"]["n"] for e in children.values()) == list(range(8))
    # `brain history` tells the batch's story in words, to its end
    said = [line for step in (await tendon.client.history(turn["turn_id"]))["steps"] for line in step["said"]]
    assert "batch call-1 accepted: 8 calls of step, parallel (at most 3 at once), all_settled" in said
    assert any(line.startswith("batch call-1: it succeeded (8 done, 0 failed") for line in said), said


async def test_an_ordered_fail_fast_batch_keeps_its_order_and_runs_nothing_after_a_failure(
    tendon: LocalTendon, tmp_path: Path
) -> None:
    items = [{"n": 0, "delay": 0.05}, {"n": 1, "delay": 0.05}, {"n": 2, "fail": True}, {"n": 3}, {"n": 4}]
    args = {"tool": "step", "items": items, "mode": "ordered", "on_failure": "fail_fast"}
    turn = await tendon.run(agent("line", args), "go")
    assert turn["status"] == "completed", turn

    log = events(tmp_path / "log")
    assert [n for what, _, n, _ in log if what == "start"] == [0, 1, 2]
    assert most_at_once(log) == 1
    (batch,) = [e for e in turn["executions"] if e["tool"] == "batch"]
    assert batch["status"] == "failed" and batch["error"]["code"] == "batch_failed"
    assert "call 2" in batch["error"]["message"]
    statuses = [c["status"] for c in batch["result"]["calls"]]
    assert statuses == ["succeeded", "succeeded", "failed", "cancelled", "cancelled"]
    assert [c.get("how") for c in batch["result"]["calls"]][3:] == ["not_run", "not_run"]


async def test_a_batch_the_brain_cannot_run_is_refused_to_the_model(tendon: LocalTendon) -> None:
    turn = await tendon.run(agent("bad", {"tool": "step", "items": [{"n": "x"}]}), "go")
    assert turn["status"] == "completed"
    (batch,) = turn["executions"]
    assert (batch["status"], batch["how"]) == ("failed", "rejected")
    assert "item 0" in batch["error"]["message"]


async def test_a_parallel_fail_fast_batch_starts_nothing_after_a_failure(
    tendon: LocalTendon, tmp_path: Path
) -> None:
    items = [{"n": 0, "fail": True, "delay": 0.05}, {"n": 1, "delay": 0.3}] + [{"n": i} for i in range(2, 8)]
    args = {"tool": "step", "items": items, "mode": "parallel", "limit": 2, "on_failure": "fail_fast"}
    turn = await tendon.run(agent("fast", args), "go")
    assert turn["status"] == "completed", turn

    # Call 0 failed while call 1 ran: call 1 finished, nothing after it started
    assert sorted(n for what, _, n, _ in events(tmp_path / "log") if what == "start") == [0, 1]
    (batch,) = [e for e in turn["executions"] if e["tool"] == "batch"]
    assert batch["status"] == "failed" and "call 0" in batch["error"]["message"]
    statuses = [c["status"] for c in batch["result"]["calls"]]
    assert statuses == ["failed", "succeeded"] + ["cancelled"] * 6


async def test_the_repair_scan_admits_what_a_lost_apply_left(
    tendon: LocalTendon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given applies that never admit anything (as if each one's admission were lost)
    async def lost(*_: Any) -> list[Any]:
        return []

    monkeypatch.setattr("brain.run.updates.admit_after_apply", lost)
    items = [{"n": i, "delay": 0.05} for i in range(5)]
    turn = await tendon.run(agent("scan", {"tool": "step", "items": items, "mode": "ordered"}), "go")

    # Then the scan admits each call in turn and settles the batch
    assert turn["status"] == "completed", turn
    assert [n for what, _, n, _ in events(tmp_path / "log") if what == "start"] == list(range(5))
    (batch,) = [e for e in turn["executions"] if e["tool"] == "batch"]
    assert [c["status"] for c in batch["result"]["calls"]] == ["succeeded"] * 5


async def test_no_person_answers_a_batch_and_a_cancel_admits_no_more_of_it(
    tendon: LocalTendon, tmp_path: Path
) -> None:
    items = [{"n": i, "delay": 0.5} for i in range(6)]
    turn_id = await tendon.submit(agent("held", {"tool": "step", "items": items, "mode": "ordered"}), "go")

    async def first_started() -> bool:
        return any(what == "start" for what, *_ in events(tmp_path / "log"))

    await wait_for(first_started, timeout=30, what="the first call to start")
    # The batch call and a call waiting for its turn are answered by the batch, never by a person
    for call in ("call-1", "call-1#3"):
        receipt = await tendon.client.respond(turn_id, call, "approve")
        assert receipt["status"] == "rejected" and "part of a batch" in receipt["reason"], receipt

    # A cancel stops the batch: the call running is stopped or settles, no other one starts
    await tendon.client.control(turn_id, "cancel")
    turn = await tendon.wait(turn_id)
    assert turn["status"] == "cancelled"
    await asyncio.sleep(0.8)  # a call admitted late would have started by now
    assert [n for what, _, n, _ in events(tmp_path / "log") if what == "start"] == [0]
    statuses = {e["call_id"]: e["status"] for e in turn["executions"]}
    assert statuses["call-1"] == "cancelled"
    assert all(statuses[f"call-1#{i}"] == "cancelled" for i in range(1, 6))


async def test_a_paused_batch_starts_no_call_until_it_is_resumed(tendon: LocalTendon, tmp_path: Path) -> None:
    items = [{"n": i, "delay": 0.4} for i in range(4)]
    turn_id = await tendon.submit(agent("paused", {"tool": "step", "items": items, "mode": "ordered"}), "go")

    async def first_started() -> bool:
        return any(what == "start" for what, *_ in events(tmp_path / "log"))

    await wait_for(first_started, timeout=30, what="the first call to start")
    await tendon.client.control(turn_id, "pause")
    await asyncio.sleep(1.0)  # call 0 ends meanwhile: nothing takes its place
    assert [n for what, _, n, _ in events(tmp_path / "log") if what == "start"] == [0]

    revision = (await tendon.client.turn(turn_id))["revision"]
    await tendon.client.control(turn_id, "resume", revision=revision)
    turn = await tendon.wait(turn_id)
    assert turn["status"] == "completed"
    assert [n for what, _, n, _ in events(tmp_path / "log") if what == "start"] == [0, 1, 2, 3]
