"""Tendon agents as MCP tools: a Brain process serves an agent at /mcp (TENDON_MCP_AGENTS), and an
MCP client (the official SDK) runs it with a bearer token that decides the namespace."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from brain.api.auth import hash_token
from hands.tools.declare import ToolContext
from hands.tools.mcp_client import McpConnection, McpUnreachableError
from hands.tools.mcp_config import McpServerSpec
from hands.tools.mcp_pool import McpTools
from hands.tools.mcp_tasks import TaskCreated
from tests.support import Observer, Processes, TendonEnv, free_port, wait_for

pytestmark = pytest.mark.chaos


async def test_an_agent_served_at_mcp_runs_a_durable_turn_per_request_id_in_the_tokens_namespace(
    tendon: TendonEnv, processes: Processes, monkeypatch: pytest.MonkeyPatch
) -> None:
    tendon.routes.add("hello")
    port = free_port()
    env = {
        **tendon.env,
        "TENDON_HTTP": f"127.0.0.1:{port}",
        "TENDON_MCP_AGENTS": "examples/hello_agent.json",
        "TENDON_API_TOKENS": f"acme:{hash_token('acme-secret')}",
    }
    await processes.start_ready("brain", ["-m", "brain", "serve"], env)
    hands = ["-m", "hands", "serve", "--route", "hello", "--tools", "examples.hello_tools"]
    await processes.start_ready("hands", hands, env)
    url = f"http://127.0.0.1:{port}/mcp"
    spec = McpServerSpec(name="brain", url=url, headers_from_env={"Authorization": "BRAIN_AUTH"})
    monkeypatch.setenv("BRAIN_AUTH", "Bearer acme-secret")

    async with httpx2.AsyncClient(headers={"Authorization": "Bearer acme-secret"}) as http:
        async with Client(streamable_http_client(url, http_client=http), cache=None) as client:
            (tool,) = (await client.list_tools()).tools
            assert tool.name == "hello" and "input" in tool.input_schema["properties"]
            first = await client.call_tool("hello", {"input": "Say hello", "request_id": "r1"})
            again = await client.call_tool("hello", {"input": "Say hello", "request_id": "r1"})
    answer = first.structured_content
    assert answer["status"] == "completed" and "Hello, world!" in answer["result"]["text"]
    assert again.structured_content["turn_id"] == answer["turn_id"], "the request id is idempotent"

    # A Tendon pool's client advertises the Tasks extension: the turn is its task, its id the
    # handle the pool keeps in its ledger before it polls.
    kept: list[str] = []
    ctx = ToolContext(operation_id="op-2")

    async def keep(handle: str) -> None:
        kept.append(handle)

    ctx.handle_keeper = keep
    async with McpTools("agents", [spec]) as source:
        (hello,) = source.tools
        followed = await hello.fn(ctx, input="Say hello")
    (handle,) = kept
    assert "Hello, world!" in followed["structuredContent"]["result"]["text"]
    assert json.loads(handle)["mcp_task"] == followed["structuredContent"]["turn_id"] != answer["turn_id"]
    assert followed["structuredContent"]["request_id"] == "op-2", "the operation id is the request id"
    turns = await Observer(tendon).fetch("SELECT namespace, session_id FROM {brain}.turns")
    assert [(t["namespace"], t["session_id"]) for t in turns] == [("acme", "acme/mcp")] * 2  # by key

    # A token the Brain does not know reaches no agent (HTTP 401 before any MCP).
    async with httpx.AsyncClient() as http:
        refusal = await http.post(url, headers={"Authorization": "Bearer wrong"}, json={})
    assert refusal.status_code == 401 and refusal.json()["error"]["code"] == "unauthorized"
    monkeypatch.setenv("BRAIN_AUTH", "Bearer wrong")
    refused = McpConnection(spec)
    try:
        with pytest.raises(McpUnreachableError, match="cannot connect to MCP server brain"):
            await refused.list_tools()
    finally:
        await refused.close()


async def test_a_long_turn_is_a_task_that_tasks_cancel_cancels(
    tendon: TendonEnv, processes: Processes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = tmp_path / "gate"
    agent = {
        "name": "slow",
        "version": "1",
        "instructions": "Think for a while.",
        "model": {"kind": "scripted", "script": [{"gate": str(gate), "content": "done thinking"}]},
        "tools": [],
    }
    (tmp_path / "slow.json").write_text(json.dumps(agent))
    port = free_port()
    env = {**tendon.env, "TENDON_HTTP": f"127.0.0.1:{port}", "TENDON_MCP_AGENTS": str(tmp_path / "slow.json")}
    await processes.start_ready("brain", ["-m", "brain", "serve"], env)
    connection = McpConnection(McpServerSpec(name="brain", url=f"http://127.0.0.1:{port}/mcp"))
    try:
        with pytest.raises(TaskCreated) as created:
            await connection.call("slow", {"input": "think"}, {})
        task_id = created.value.task.task_id
        assert (await connection.task("tasks/get", task_id)).status == "working"
        await connection.task("tasks/cancel", task_id)
        gate.touch()  # the model call in flight ends; the cancel takes the turn at that boundary

        async def cancelled() -> bool:
            return (await connection.task("tasks/get", task_id)).status == "cancelled"

        await wait_for(cancelled, timeout=30, what="the task to be cancelled")
    finally:
        await connection.close()
    turn = await Observer(tendon).turn(task_id)
    assert turn is not None and turn["status"] == "cancelled", "the task id is the turn id"
