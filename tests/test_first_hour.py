"""A first hour without surprises, on the embedded backend in this process (``local.testing``, the
way a user's own tests run Tendon): `brain wait` says how a turn ended by its exit code (a
cancelled turn is not a failed one); `brain history` and `brain watch` print each step with its
time, in words; the example tool stops when cancelled; the README's own test example passes as
written."""

from __future__ import annotations

import argparse
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from brain.face import commands
from brain.face.watch import Shown
from infra.process.settings import Settings
from local.testing import LocalTendon, local_tendon
from tests.support import REPO, run_cli, wait_for

TIME = r"\d\d:\d\d:\d\d\.\d{3}"


@pytest.fixture
async def tendon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalTendon]:
    monkeypatch.setenv("BULK_RUNS_FILE", str(tmp_path / "runs.txt"))
    async with local_tendon(tmp_path, "tests.brain_e2e_tools", "examples.hello_tools") as running:
        yield running


def scripted(name: str, script: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"name": name, "version": "1", "model": {"kind": "scripted", "script": script}, **fields}


async def _wait(tendon: LocalTendon, turn_id: str) -> int:
    args = argparse.Namespace(turn_id=turn_id, timeout=30.0, json=False, url=None)
    return await commands.wait(Settings(url=tendon.url), args)


async def test_brain_wait_exits_with_a_code_of_its_own_for_a_cancelled_turn(tendon: LocalTendon) -> None:
    # Given a turn that completes, one that fails, and one cancelled while it waits for a tool
    done = await tendon.submit(scripted("done", [{"content": "ok"}]), "hi", session="done")
    broken = scripted("broken", [{"error": "no such model", "retryable": False}])
    failed = await tendon.submit(broken, "hi", session="failed")
    stuck = await tendon.submit(
        scripted("stuck", [{"content": "?"}], tools=["nobody_serves_it"]), "hi", session="stuck"
    )
    await wait_for(lambda: _status(tendon, stuck, "waiting"), timeout=30, what="the wait for bindings")
    assert (await tendon.client.control(stuck, "cancel"))["status"] == "applied"
    # When each is waited for, then each exit code says how it ended
    codes = [await _wait(tendon, t) for t in (done, failed, stuck)]
    assert codes == [0, commands.EXIT_FAILED, commands.EXIT_CANCELLED] == [0, 1, 7]


async def _status(tendon: LocalTendon, turn_id: str, wanted: str) -> bool:
    return (await tendon.client.turn(turn_id))["status"] == wanted  # type: ignore[no-any-return]


async def test_brain_history_prints_each_run_model_call_and_step_with_its_time_in_words(
    tendon: LocalTendon, capsys: pytest.CaptureFixture[str]
) -> None:
    turn = await tendon.run("examples/hello_agent.json", "Say hello")
    capsys.readouterr()
    assert (
        await commands.history(
            Settings(url=tendon.url), argparse.Namespace(turn_id=turn["turn_id"], json=False, url=None)
        )
        == 0
    )
    out = capsys.readouterr().out
    assert re.search(
        r"^runs \(local times, .*; the turn began \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\)", out, re.M
    ), out
    assert re.search(
        rf"^  {TIME}  run 1 \(epoch 1\) began at phase prepare on brain-\S+: left the turn waiting$",
        out,
        re.M,
    ), out
    assert re.search(
        rf"^  {TIME}  #1 attempt 1: replied in <1 ms \(1 steps\); asked for 1 tool call\(s\)$", out, re.M
    ), out
    assert re.search(rf"^  {TIME}  #1 +\w+/\w+: the turn was accepted: 'Say hello'", out, re.M), out
    assert re.search(rf"^  {TIME}  #\d+ +\w+/\w+: greet \(call-1\) succeeded: ran", out, re.M), out
    assert "turn.accepted" not in out  # no fact names


def test_brain_watch_prints_each_entry_with_its_time_in_words(tmp_path: Path) -> None:
    console = Console(record=True, width=400)
    shown = Shown(console, "t1", tmp_path / "cursor")
    pay = {"execution_id": "e1", "call_id": "call-2", "tool": "pay"}
    send = {"execution_id": "e2", "call_id": "call-4", "tool": "send_email"}
    facts = [
        {"kind": "execution.pending", **pay, "awaits": "approval"},
        {"kind": "execution.succeeded", **send, "how": "verified_by_query"},
        {"kind": "turn.run_lost", "run": 3, "phase": "model_request", "how": "died"},
    ]
    shown.entry({"seq": 7, "at": "2026-01-02T03:04:05.678+00:00", "facts": facts})
    lines = [re.sub(rf"^{TIME} #   7 ", "", line) for line in console.export_text().splitlines()]
    assert lines == [
        "pay (call-2) waits for a person's approval",
        "send_email (call-4) succeeded: verified by query: its worker died inside the tool, and the worker "
        "that took it over asked the external system about its operation id instead of running it again",
        "run 3 was lost at phase model_request: its Brain died; another run takes over",
    ]


async def test_the_example_counting_tool_stops_at_once_when_cancelled(tendon: LocalTendon) -> None:
    counter = scripted(
        "counter", [{"tool_calls": [{"tool": "count", "args": {"to": 1000, "every": 60}}]}], tools=["count"]
    )
    turn_id = await tendon.submit(counter, "count slowly")

    async def counted() -> Any:
        found = (await tendon.client.turn(turn_id))["executions"]
        return found and (await tendon.client.output(found[0]["id"]))["pages"]

    await wait_for(counted, timeout=30, what="the first number")
    await tendon.client.control(turn_id, "cancel")
    turn = await tendon.wait(turn_id, within=30)  # not the 60 s the next number would take
    assert turn["status"] == "cancelled"
    assert turn["executions"][0]["status"] == "cancelled"


async def test_the_readmes_test_example_passes_as_written() -> None:
    readme = (REPO / "README.md").read_text()
    example = (REPO / "examples" / "test_hello.py").read_text()
    assert example.strip() in readme
    code, out, err = await run_cli(
        ["-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "examples/test_hello.py"], {}
    )
    assert code == 0, out + err
    assert "2 passed" in out
