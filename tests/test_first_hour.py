"""A first hour without surprises, on the embedded backend in this process (``local.testing``, the
way a user's own tests run Tendon): `brain wait` says how a turn ended by its exit code (a
cancelled turn is not a failed one); `brain history` and `brain watch` print each step with its
time, in words; a local server takes an edited agent file under its name, and a thread with
nothing unfinished moves to it; the example tool stops when cancelled; the README's own test
example passes as written."""

from __future__ import annotations

import argparse
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from brain import verbs
from brain.face import commands
from brain.face.watch import Shown
from brain.rules.agents import AgentDefinition
from brain.store import BrainStore
from infra.process.settings import Settings
from local.testing import LocalTendon, local_tendon
from protocol import ConflictError
from tests.support import REPO, run_cli, wait_for
from tests.test_brain_store import _agent, _submit, store

__all__ = ["store"]  # the fixture, used by name

TIME = r"\d\d:\d\d:\d\d\.\d{3}"


@pytest.fixture
async def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalTendon]:
    monkeypatch.setenv("BULK_RUNS_FILE", str(tmp_path / "runs.txt"))
    async with local_tendon(tmp_path, "tests.brain_e2e_tools", "examples.hello_tools") as running:
        yield running


def scripted(name: str, script: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"name": name, "version": "1", "model": {"kind": "scripted", "script": script}, **fields}


async def _wait(local: LocalTendon, turn_id: str) -> int:
    args = argparse.Namespace(turn_id=turn_id, timeout=30.0, json=False, url=None)
    return await commands.wait(Settings(url=local.url), args)


async def test_brain_wait_exits_with_a_code_of_its_own_for_a_cancelled_turn(local: LocalTendon) -> None:
    # Given a turn that completes, one that fails, and one cancelled while it waits for a tool
    done = await local.submit(scripted("done", [{"content": "ok"}]), "hi", session="done")
    broken = scripted("broken", [{"error": "no such model", "retryable": False}])
    failed = await local.submit(broken, "hi", session="failed")
    stuck = await local.submit(
        scripted("stuck", [{"content": "?"}], tools=["nobody_serves_it"]),
        "hi",
        session="stuck",
        expect_tools=True,
    )
    await wait_for(lambda: _status(local, stuck, "waiting"), timeout=30, what="the wait for bindings")
    assert (await local.client.control(stuck, "cancel"))["status"] == "applied"
    # When each is waited for, then each exit code says how it ended
    codes = [await _wait(local, t) for t in (done, failed, stuck)]
    assert codes == [0, commands.EXIT_FAILED, commands.EXIT_CANCELLED] == [0, 1, 7]


async def _status(local: LocalTendon, turn_id: str, wanted: str) -> bool:
    return (await local.client.turn(turn_id))["status"] == wanted  # type: ignore[no-any-return]


async def test_brain_history_prints_each_run_model_call_and_step_with_its_time_in_words(
    local: LocalTendon, capsys: pytest.CaptureFixture[str]
) -> None:
    turn = await local.run("examples/hello_agent.json", "Say hello")
    capsys.readouterr()
    assert (
        await commands.history(
            Settings(url=local.url), argparse.Namespace(turn_id=turn["turn_id"], json=False, url=None)
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


async def test_a_local_server_takes_an_edited_agent_under_its_name_and_moves_an_idle_thread_to_it(
    local: LocalTendon,
) -> None:
    # Given a session whose thread ran version 1 of an agent
    first = scripted("dev", [{"content": "first draft"}])
    assert (await local.run(first, "hi", session="dev"))["result"]["text"] == "first draft"
    # When the agent's file is edited, its version left as it was, and submitted again
    edited = scripted("dev", [{"content": "second draft"}])
    turn = await local.run(edited, "hi again", session="dev")
    # Then there is no CONFLICT: the thread moved to the edit, which answered
    assert turn["result"]["text"] == "second draft"
    (thread,) = await local.client.threads("dev")
    digest = AgentDefinition.model_validate(edited).digest
    assert (thread["agent_name"], thread["agent_version"]) == ("dev", f"1+{digest[:12]}")
    # And a thread with a turn still unfinished keeps its version: that is still a CONFLICT
    slow = scripted(
        "dev", [{"tool_calls": [{"tool": "slow_step", "args": {"seconds": 60}}]}], tools=["slow_step"]
    )
    waiting = await local.submit(slow, "take your time", session="dev")
    await wait_for(lambda: _status(local, waiting, "waiting"), timeout=30, what="the tool to run")
    with pytest.raises(ConflictError, match="pinned to agent dev version 1\\+"):
        await local.submit(first, "again", session="dev")
    await local.client.control(waiting, "cancel")


async def test_a_thread_moves_to_an_edited_agent_only_when_nothing_of_it_is_unfinished(
    store: BrainStore,
) -> None:
    # Given a thread of version 1 with an unfinished turn (both backends)
    turn = await _submit(store)
    edited = _agent(instructions="edited").versioned_by_content()

    async def repin() -> bool:
        return await store.transact(lambda c: store.sessions.repin_thread(c, "ns", "ns/s1", edited))

    # Then it stays pinned while the turn is unfinished, or for another namespace
    assert await repin() is False
    await store.pool.execute("UPDATE turns SET status = 'completed' WHERE id = $1", turn)
    assert await store.transact(lambda c: store.sessions.repin_thread(c, "other", "ns/s1", edited)) is False
    # And moves once it is done, its bindings to be frozen again by its next turn
    assert await repin() is True
    (thread,) = await verbs.threads(store, namespace="ns", session_id="s1")
    assert thread["agent_version"] == edited.version and edited.version.startswith("1+")
    assert await store.pool.fetchval("SELECT bindings FROM threads WHERE id = 'ns/s1'") is None
    assert await repin() is False  # it is there already


async def test_the_example_counting_tool_stops_at_once_when_cancelled(local: LocalTendon) -> None:
    counter = scripted(
        "counter", [{"tool_calls": [{"tool": "count", "args": {"to": 1000, "every": 60}}]}], tools=["count"]
    )
    turn_id = await local.submit(counter, "count slowly")

    async def counted() -> Any:
        found = (await local.client.turn(turn_id))["executions"]
        return found and (await local.client.output(found[0]["id"]))["pages"]

    await wait_for(counted, timeout=30, what="the first number")
    await local.client.control(turn_id, "cancel")
    turn = await local.wait(turn_id, within=30)  # not the 60 s the next number would take
    assert turn["status"] == "cancelled"
    assert turn["executions"][0]["status"] == "cancelled"


def _printed(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """What a command printed, without the log lines of the system running in this process."""
    return [line for line in capsys.readouterr().out.splitlines() if not re.match(r"\d{4}-\d\d-\d\d ", line)]


async def test_brain_output_follow_prints_a_tools_output_as_it_comes_until_its_outcome(
    local: LocalTendon, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a tool that counts to 5, a number every 0.3 s, started by a turn
    counter = scripted(
        "counter5", [{"tool_calls": [{"tool": "count", "args": {"to": 5, "every": 0.3}}]}], tools=["count"]
    )
    turn_id = await local.submit(counter, "count")

    async def started() -> Any:
        return (await local.client.turn(turn_id))["executions"]

    (execution,) = await wait_for(started, timeout=30, what="the call")
    # When `brain output --follow` reads it from its start while it runs
    args = argparse.Namespace(execution_id=execution["id"], offset=0, follow=True, url=local.url)
    code = await commands.output(Settings(url=local.url), args)
    # Then it printed every number once, in order, and returned once the outcome sealed the output
    assert code == 0 and _printed(capsys) == ["1", "2", "3", "4", "5"]
    assert (await local.client.turn(turn_id))["executions"][0]["status"] == "succeeded"
    # And from an offset, without following, it prints what is there from that byte on
    args = argparse.Namespace(execution_id=execution["id"], offset=4, follow=False, url=local.url)
    assert await commands.output(Settings(url=local.url), args) == 0
    assert _printed(capsys) == ["3", "4", "5"]


async def test_the_readmes_test_example_passes_as_written() -> None:
    readme = (REPO / "README.md").read_text()
    example = (REPO / "examples" / "test_hello.py").read_text()
    assert example.strip() in readme
    code, out, err = await run_cli(
        ["-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "examples/test_hello.py"], {}
    )
    assert code == 0, out + err
    assert "2 passed" in out
