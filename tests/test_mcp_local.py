"""MCP servers in the embedded mode: `brain serve --local --mcp ROUTE=SPEC` serves an MCP server's
tools from a pool in the same process, on SQLite and the local queue, with the same durability: a
process killed while a task waits for a person's input comes back, re-attaches to the task by the
id in its ledger and sends the answer given through its API. Real processes: the local server and
the test MCP server (``tests/mcp_server.py`` over Streamable HTTP, which outlives the kill). A
tool the server adds while the process runs may be named by a submit at once."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import Processes, free_port, run_cli, wait_for
from tests.test_api_reconcile import answers
from tests.test_e2e_mcp import BRAIN, calls, http_server, records

pytestmark = pytest.mark.chaos

AGENT = {
    "name": "refunder", "version": "1", "instructions": "Refund.", "tools": ["refund"],
    "model": {"kind": "scripted", "script": [
        {"tool_calls": [{"tool": "refund", "args": {"amount": 7}}]}, {"content": "Done:\n{results}"}]},
}  # fmt: skip


async def run(http: httpx.AsyncClient, tool: str, request_id: str, *, quiet: bool = False) -> Any:
    """A turn of an agent that calls ``tool`` once, as it ended (None, when ``quiet``, if the
    submit is refused: the tool is not served yet)."""
    script = [{"tool_calls": [{"tool": tool, "args": {}}]}, {"content": "ok"}]
    agent = {"name": f"use-{tool}", "version": "1", "instructions": "Go.", "tools": [tool],
             "model": {"kind": "scripted", "script": script}}  # fmt: skip
    body = {"request_id": request_id, "input": "go", "agent": agent}
    answer = await http.post(f"/v1/sessions/s-{tool}/turns", json=body)
    if quiet and answer.status_code != 201:
        return None
    assert answer.status_code == 201, answer.text
    return (await http.get(f"/v1/turns/{answer.json()['turn_id']}", params={"wait": "30"})).json()


async def asking(http: httpx.AsyncClient, turn_id: str) -> Any:
    async def asks() -> Any:
        shown = (await http.get(f"/v1/turns/{turn_id}")).json()
        waiting = [e for e in shown.get("executions", []) if e.get("awaits") == "input"]
        return waiting[0] if waiting else None

    return await wait_for(asks, timeout=30, what="the call to ask for input")


async def test_the_embedded_mode_serves_an_mcp_server_and_a_task_waiting_for_input_survives_a_kill(
    processes: Processes, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    url = await http_server(processes, log)
    port = free_port()
    args = [*BRAIN, "--local", "--data-dir", str(tmp_path / "data"), "--http", f"127.0.0.1:{port}"]
    args += ["--mcp", f"shop={url}"]
    env = {"TENDON_LOG_FORMAT": "json"}
    doomed = await processes.start_ready("local", args, env)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        await wait_for(lambda: answers(http), timeout=30, what="the local server's HTTP API")
        body = {"request_id": "r1", "input": "refund it", "agent": AGENT}
        answer = await http.post("/v1/sessions/s-local/turns", json=body)
        assert answer.status_code == 201, answer.text
        turn_id = answer.json()["turn_id"]
        asked = await asking(http, turn_id)
        assert asked["asks"]["message"] == "Refund 7 EUR?"

        doomed.send_signal(signal.SIGKILL)  # the whole system, while the task waits for the person
        await processes.wait_exit(doomed)
        await processes.start_ready("local", args, env)
        await wait_for(lambda: answers(http), timeout=30, what="the local server's HTTP API")
        respond = {"call": asked["call_id"], "decision": "result", "result": {"ok": True}, "request_id": "a1"}
        said = await http.post(f"/v1/turns/{turn_id}/respond", json=respond)
        assert said.status_code == 200 and said.json()["status"] == "applied", said.text
        turn = (await http.get(f"/v1/turns/{turn_id}", params={"wait": "30"})).json()

        # A tool the server adds while the process runs is served, and a submit may name it at once.
        done = await run(http, "reshape", "r2")
        assert done["executions"][0]["status"] == "succeeded"
        added = await wait_for(
            lambda: run(http, "refund_all", "r3", quiet=True), timeout=30, what="refund_all"
        )
        assert added["status"] == "completed" and added["executions"][0]["status"] == "succeeded"

    assert turn["status"] == "completed", turn
    (row,) = turn["executions"]
    assert row["result"]["structuredContent"] == {"refunded": 7}
    assert len(calls(log, "refund")) == 1, "re-attached by its task id after the kill, never called again"
    assert [u["responses"] for u in records(log, "update")] == [
        {"confirm": {"action": "accept", "content": {"ok": True}}}
    ]


async def test_an_mcp_spec_without_its_route_is_one_line_and_the_usage_exit_code() -> None:
    code, _, err = await run_cli([*BRAIN, "--local", "--mcp", "stdio:python -m srv"], {})
    assert code == 2 and len(err.strip().splitlines()) == 1 and "is not ROUTE=" in err, err
    code, _, err = await run_cli([*BRAIN, "--mcp", "lab=stdio:python -m srv"], {})
    assert code == 2 and "go with --local" in err, err
