"""MCP servers served by a Hands pool, with a Brain, Hands and MCP servers as real processes.

The MCP server is ``tests/mcp_server.py`` (the SDK's server side), over stdio (the pool starts
it) or Streamable HTTP (the test starts it). Its call log outlives its processes, so a test
counts what the server saw across crashes; its gate holds a call in flight while the test acts.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import Observer, Processes, TendonEnv, free_port, run_cli, wait_for

pytestmark = pytest.mark.chaos

BRAIN = ["-m", "brain", "serve"]
SERVER = ["-m", "tests.mcp_server"]


def stdio(log: Path, gate: Path | None = None) -> str:
    more = f" --gate {gate}" if gate else ""
    return f"stdio:{sys.executable} -m tests.mcp_server --log {log}{more}"


def hands(*mcp: str) -> list[str]:
    return ["-m", "hands", "serve", "--route", "lab", *(a for spec in mcp for a in ("--mcp", spec))]


def agent(tmp_path: Path, calls: list[list[dict[str, Any]]], tools: list[str]) -> Path:
    script: list[dict[str, Any]] = [{"tool_calls": c} for c in calls]
    definition = {
        "name": "mcp-user",
        "version": "1",
        "instructions": "Use the tools.",
        "model": {"kind": "scripted", "script": [*script, {"content": "Done:\n{results}"}]},
        "tools": tools,
        "limits": {"max_model_calls": 10},
    }
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(definition))
    return path


async def submit(env: dict[str, str], agent_file: Path, request_id: str = "r1") -> str:
    args = ["-m", "brain", "submit", "--session", "s-mcp", "--request-id", request_id]
    code, out, err = await run_cli([*args, "--agent", str(agent_file), "Go"], env)
    assert code == 0, err
    return out.strip()


def calls(log: Path, tool: str) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in log.read_text().splitlines() if x] if log.exists() else []
    return [r for r in lines if r["tool"] == tool and r["event"] == "call"]


async def called(log: Path, tool: str, count: int = 1) -> list[dict[str, Any]]:
    async def enough() -> list[dict[str, Any]] | None:
        seen = calls(log, tool)
        return seen if len(seen) >= count else None

    return await wait_for(enough, timeout=30, what=f"{count} call(s) of {tool} on the MCP server")


async def execution(obs: Observer, turn_id: str, status: str) -> Any:
    async def reached() -> Any:
        rows = await obs.executions(turn_id)
        return rows[0] if rows and rows[0]["status"] == status else None

    return await wait_for(reached, timeout=30, what=f"the execution to be {status}")


async def http_server(processes: Processes, log: Path, gate: Path | None = None) -> str:
    port = free_port()
    more = ["--gate", str(gate)] if gate else []
    proc = processes.start("mcp-http", [*SERVER, "--log", str(log), "--http", str(port), *more], {})

    async def listening() -> bool:
        assert proc.poll() is None, processes.output(proc)
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return False
        writer.close()
        return True

    await wait_for(listening, timeout=30, what="the MCP server to listen")
    return f"http://127.0.0.1:{port}/mcp"


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_an_mcp_servers_tools_are_announced_and_a_turn_calls_them(
    tendon: TendonEnv, processes: Processes, tmp_path: Path, transport: str
) -> None:
    log = tmp_path / "calls.jsonl"
    # A result over the offload threshold travels through S3 like any other.
    env = {**tendon.env, "TENDON_OFFLOAD_THRESHOLD": "4096"}
    if transport == "stdio":
        pool = hands(stdio(log))
    else:
        url = await http_server(processes, log)
        config = tmp_path / "mcp.json"
        servers = {"billing": {"url": url, "headers_from_env": {"X-Api-Key": "BILLING_KEY"}}}
        config.write_text(json.dumps({"servers": servers}))
        pool = [*hands(), "--mcp-config", str(config)]
        env["BILLING_KEY"] = "secret-key-value"
    await processes.start_ready("brain", BRAIN, env)
    await processes.start_ready("hands", pool, env)
    script = [
        [{"tool": "lookup", "args": {"key": "abc"}}],
        [{"tool": "picture", "args": {"caption": "a dot"}}],
        [{"tool": "decline", "args": {"amount": 7}}],
        [{"tool": "big", "args": {"size": 20000}}],
    ]
    turn_id = await submit(env, agent(tmp_path, script, ["lookup", "picture", "decline", "big"]))

    obs = Observer(tendon)
    await obs.wait_turn(turn_id, "completed")
    lookup, picture, decline, big = await obs.executions(turn_id)
    assert lookup["status"] == "succeeded"
    assert lookup["result"]["structuredContent"] == {"key": "abc", "value": "ABC"}
    assert picture["result"]["content"] == [
        {"type": "text", "text": "a dot"},
        {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
    ]
    assert picture["result"]["structuredContent"] == {"caption": "a dot", "pixels": 1}
    # isError is a tool error the model sees
    assert decline["status"] == "failed" and decline["error"]["code"] == "tool_error"
    assert "card declined for 7" in decline["error"]["message"]
    assert big["status"] == "succeeded" and big["result"]["content"][0]["text"] == "x" * 20000
    succeeded = [e for e in await obs.hands_events(big["id"]) if e["kind"] == "succeeded"]
    assert succeeded[0].get("body_ref"), "the big result went through the object store"
    # The bindings announced carry the server's schema and a version from its listing.
    rows = await obs.fetch("SELECT binding FROM {brain}.bindings WHERE route = 'lab'")
    by_name = {r["binding"]["name"]: r["binding"] for r in rows}
    assert by_name["lookup"]["version"].startswith("mcp-")
    assert by_name["lookup"]["input_schema"]["properties"]["key"]["type"] == "string"
    assert by_name["lookup"]["replay_policy"] == "safe" and by_name["charge"]["replay_policy"] == "unsafe"
    assert by_name["pay"]["has_query"] and not by_name["charge"]["has_query"]
    assert "secret-key-value" not in json.dumps(by_name)
    sent = calls(log, "lookup")[0]["api_key"]
    assert sent == ("secret-key-value" if transport == "http" else None), "headers come from the environment"


def records(log: Path, event: str) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in log.read_text().splitlines() if x] if log.exists() else []
    return [r for r in lines if r["event"] == event]


@pytest.mark.parametrize("tool", ["charge", "lookup"], ids=["unsafe", "safe"])
async def test_a_hands_worker_killed_mid_call_to_a_plain_server(
    tendon: TendonEnv, processes: Processes, tmp_path: Path, tool: str
) -> None:
    log, gate = tmp_path / "calls.jsonl", tmp_path / "gate"
    pool = hands(stdio(log, gate))
    env = tendon.env
    await processes.start_ready("brain", BRAIN, env)
    doomed = await processes.start_ready("hands", pool, env)
    args = {"amount": 5} if tool == "charge" else {"key": "k"}
    turn_id = await submit(env, agent(tmp_path, [[{"tool": tool, "args": args}]], [tool]))

    (first,) = await called(log, tool)
    doomed.send_signal(signal.SIGKILL)  # mid-call: the server holds it at its gate
    await processes.wait_exit(doomed)
    obs = Observer(tendon)
    if tool == "charge":
        await processes.start_ready("hands", pool, env)
        row = await execution(obs, turn_id, "unknown")
        assert "has no query" in row["error"]["message"]
        assert len(calls(log, "charge")) == 1, "an unsafe call lost in a crash is never made again"
        turn = await obs.turn(turn_id)
        assert turn["status"] == "waiting" and "reconcile" in turn["waiting_for"]
    else:
        gate.touch()
        await processes.start_ready("hands", pool, env)
        await obs.wait_turn(turn_id, "completed")
        again = calls(log, "lookup")
        assert len(again) == 2 and again[1]["op"] == first["op"], "a safe call is made again"
        (row,) = await obs.executions(turn_id)
        assert row["result"]["structuredContent"] == {"key": "k", "value": "K"}


async def test_with_the_durable_extension_a_killed_call_is_verified_by_its_query_not_made_again(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    log, gate = tmp_path / "calls.jsonl", tmp_path / "gate"
    url = await http_server(processes, log, gate)
    env = tendon.env
    await processes.start_ready("brain", BRAIN, env)
    doomed = await processes.start_ready("hands", hands(url), env)
    turn_id = await submit(env, agent(tmp_path, [[{"tool": "pay", "args": {"amount": 9}}]], ["pay"]))

    (first,) = await called(log, "pay")
    doomed.send_signal(signal.SIGKILL)
    await processes.wait_exit(doomed)
    gate.touch()  # the payment service finishes the payment the dead worker asked for

    async def paid() -> bool:
        return bool(records(log, "paid"))

    await wait_for(paid, timeout=30, what="the payment to finish on the server")
    await processes.start_ready("hands", hands(url), env)
    obs = Observer(tendon)
    await obs.wait_turn(turn_id, "completed")
    (row,) = await obs.executions(turn_id)
    assert row["how"] == "verified_by_query"
    assert row["result"]["structuredContent"] == {"paid": 9, "receipt": f"r-{first['op'][:8]}"}
    assert len(calls(log, "pay")) == 1, "verified, not paid twice"
    assert first["op"] == row["id"], "the server saw the execution id as the operation id"


async def test_a_cancel_of_a_running_mcp_call_stops_it_on_the_server(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    log, gate = tmp_path / "calls.jsonl", tmp_path / "gate"
    env = tendon.env
    await processes.start_ready("brain", BRAIN, env)
    await processes.start_ready("hands", hands(stdio(log, gate)), env)
    turn_id = await submit(env, agent(tmp_path, [[{"tool": "pay", "args": {"amount": 3}}]], ["pay"]))
    (first,) = await called(log, "pay")

    code, _, err = await run_cli(["-m", "brain", "cancel", turn_id], env)
    assert code == 0, err
    obs = Observer(tendon)
    await obs.wait_turn(turn_id, "cancelled")
    (row,) = await obs.executions(turn_id)
    assert row["status"] == "cancelled"
    assert [r["op"] for r in records(log, "cancelled")] == [first["op"]]
    assert records(log, "paid") == []
    (said,) = [e for e in await obs.hands_events(row["id"]) if e["kind"] == "cancelled"]
    assert "the server confirmed the cancel (cancel_payment)" in said["body"]["reason"]


@pytest.mark.parametrize("tool", ["charge", "lookup"], ids=["unsafe", "safe"])
async def test_an_mcp_server_that_dies_mid_call_is_started_again_and_the_call_goes_by_the_replay_rule(
    tendon: TendonEnv, processes: Processes, tmp_path: Path, tool: str
) -> None:
    log, gate = tmp_path / "calls.jsonl", tmp_path / "gate"
    env = tendon.env
    await processes.start_ready("brain", BRAIN, env)
    await processes.start_ready("hands", hands(stdio(log, gate)), env)
    args = {"amount": 5} if tool == "charge" else {"key": "k"}
    script = [[{"tool": tool, "args": args}], [{"tool": "lookup", "args": {"key": "after"}}]]
    turn_id = await submit(env, agent(tmp_path, script, [tool, "lookup"]))

    (first,) = await called(log, tool)
    os.kill(first["pid"], signal.SIGKILL)  # the server dies; the Hands worker lives on
    obs = Observer(tendon)
    if tool == "charge":
        row = await execution(obs, turn_id, "unknown")
        assert "closed during the call of charge" in row["error"]["message"]
        assert len(calls(log, "charge")) == 1
    else:
        again = await called(log, "lookup", 2)  # on a new server process
        assert again[1]["op"] == first["op"] and again[1]["pid"] != first["pid"]
        gate.touch()
        await obs.wait_turn(turn_id, "completed")
        rows = await obs.executions(turn_id)
        assert [r["status"] for r in rows] == ["succeeded", "succeeded"]


async def test_the_example_mcp_server_and_agent_run_as_the_readme_says(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    tendon.routes.add("notes")
    notes = tmp_path / "notes.jsonl"
    server = f"stdio:{sys.executable} -m examples.mcp_server --file {notes}"
    await processes.start_ready("brain", BRAIN, tendon.env)
    pool = ["-m", "hands", "serve", "--route", "notes", "--mcp", server]
    await processes.start_ready("hands", pool, tendon.env)
    submit = ["-m", "brain", "submit", "--session", "notes", "--request-id", "1"]
    code, out, err = await run_cli([*submit, "--agent", "examples/notes_agent.json", "buy milk"], tendon.env)
    assert code == 0, err
    code, shown, err = await run_cli(["-m", "brain", "wait", out.strip()], tendon.env)
    assert code == 0, err
    assert "buy milk" in shown
    added, read = await Observer(tendon).executions(out.strip())
    assert added["result"]["structuredContent"] == {"number": 1, "text": "buy milk"}
    assert json.loads(notes.read_text())["operation"] == added["id"]
    assert read["result"]["structuredContent"] == {"result": ["buy milk"]}


async def kept_handle(obs: Observer) -> str:
    async def kept() -> str | None:
        rows = await obs.fetch("SELECT handle FROM {hands}.executions WHERE tool = 'render'")
        return rows[0]["handle"] if rows and rows[0]["handle"] else None

    return await wait_for(kept, timeout=30, what="the task id in the ledger")


async def test_with_the_tasks_extension_a_killed_call_re_attaches_by_its_task_id_and_is_not_made_again(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    log, gate = tmp_path / "calls.jsonl", tmp_path / "gate"
    url = await http_server(processes, log, gate)
    env = tendon.env
    await processes.start_ready("brain", BRAIN, env)
    doomed = await processes.start_ready("hands", hands(url), env)
    turn_id = await submit(env, agent(tmp_path, [[{"tool": "render", "args": {"pages": 4}}]], ["render"]))

    (first,) = await called(log, "render")
    obs = Observer(tendon)
    assert json.loads(await kept_handle(obs))["mcp_task"] == first["task"]
    doomed.send_signal(signal.SIGKILL)  # while it polls tasks/get
    await processes.wait_exit(doomed)
    polled = len(records(log, "get"))
    await processes.start_ready("hands", hands(url), env)
    gate.touch()

    await obs.wait_turn(turn_id, "completed")
    (row,) = await obs.executions(turn_id)
    assert row["result"] == {
        "content": [{"type": "text", "text": "rendered 4 pages"}],
        "structuredContent": {"pages": 4},
    }
    assert len(calls(log, "render")) == 1, "re-attached by its task id, never called again"
    assert len(records(log, "get")) > polled, "the new worker polled the same task"


async def test_a_cancel_of_a_running_task_sends_tasks_cancel_and_says_the_server_confirmed(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    log, gate = tmp_path / "calls.jsonl", tmp_path / "gate"
    env = tendon.env
    await processes.start_ready("brain", BRAIN, env)
    await processes.start_ready("hands", hands(stdio(log, gate)), env)
    turn_id = await submit(env, agent(tmp_path, [[{"tool": "render", "args": {"pages": 2}}]], ["render"]))
    (first,) = await called(log, "render")
    obs = Observer(tendon)
    await kept_handle(obs)

    code, _, err = await run_cli(["-m", "brain", "cancel", turn_id], env)
    assert code == 0, err
    await obs.wait_turn(turn_id, "cancelled")
    (row,) = await obs.executions(turn_id)
    assert row["status"] == "cancelled"
    assert [r["op"] for r in records(log, "task_cancelled")] == [first["task"]]
    (said,) = [e for e in await obs.hands_events(row["id"]) if e["kind"] == "cancelled"]
    assert "the server confirmed the cancel (tasks/cancel)" in said["body"]["reason"]


async def test_a_cancel_of_a_task_waiting_for_input_sends_tasks_cancel_and_its_question_is_closed(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    env = tendon.env
    await processes.start_ready("brain", BRAIN, env)
    await processes.start_ready("hands", hands(stdio(log)), env)
    turn_id = await submit(env, agent(tmp_path, [[{"tool": "refund", "args": {"amount": 4}}]], ["refund"]))
    obs = Observer(tendon)

    async def asking() -> Any:
        rows = await obs.executions(turn_id)
        return rows[0] if rows and rows[0]["how"] == "awaiting_input" else None

    row = await wait_for(asking, timeout=30, what="the call to ask for input")
    code, _, err = await run_cli(["-m", "brain", "cancel", turn_id], env)
    assert code == 0, err
    await obs.wait_turn(turn_id, "cancelled")
    (row,) = await obs.executions(turn_id)
    assert row["status"] == "cancelled"
    (first,) = calls(log, "refund")
    assert [r["op"] for r in records(log, "task_cancelled")] == [first["task"]]
    assert records(log, "update") == [], "nothing was answered"
    code, out, err = await run_cli(["-m", "brain", "respond", turn_id, row["call_id"], "--result", "{}"], env)
    assert code == 6 and "cancelled already" in out + err, out + err
