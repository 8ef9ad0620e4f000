"""The MCP protocol revisions a pool speaks, against real stdio servers (``tests/mcp_server.py``):
2026-07-28, and each handshake-era revision through the SDK's fallback to the initialize handshake
(the server pinned to it); and a server's tool list that changes while the pool runs, heard on
either era (a ``subscriptions/listen`` stream at 2026-07-28, the notification before)."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hands.tools.declare import ToolContext
from hands.tools.mcp import McpTool
from hands.tools.mcp_config import parse_spec
from hands.tools.mcp_pool import McpTools

HANDSHAKE_ERA = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"]


def server(log: Path, pin: str | None) -> str:
    return f"stdio:{sys.executable} -m tests.mcp_server --log {log}" + (f" --pin {pin}" if pin else "")


def tool(source: McpTools, name: str) -> McpTool:
    (found,) = [t for t in source.tools if t.name == name]
    return found


@pytest.mark.parametrize("revision", HANDSHAKE_ERA)
async def test_a_server_of_an_older_revision_is_reached_by_the_handshake_and_called_the_same_way(
    tmp_path: Path, revision: str
) -> None:
    log = tmp_path / "calls.jsonl"
    async with McpTools("lab", [parse_spec(server(log, revision))]) as source:
        _, client = await source._connections[0]._client()
        assert client.protocol_version == revision
        assert tool(source, "lookup").binding.replay_policy.value == "safe"
        assert tool(source, "pay").query is not None  # the durable extension is in the listing's _meta
        found = await tool(source, "lookup").fn(ToolContext(operation_id="op-1"), key="k")
        assert found["structuredContent"] == {"key": "k", "value": "K"}
        # No Tasks extension before 2026-07-28: the server answers the call itself.
        rendered = await tool(source, "render").fn(ToolContext(operation_id="op-2"), pages=2)
        assert rendered["content"][0]["text"] == "rendered 2 pages at once"
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["op"] for r in seen if r["tool"] == "lookup"] == ["op-1"], "the operation id reached the server"


@pytest.mark.parametrize("revision", [None, "2025-11-25"], ids=["2026-07-28", "2025-11-25"])
async def test_a_tool_list_that_changes_is_listed_again_and_only_what_changed_is_told(
    tmp_path: Path, revision: str | None
) -> None:
    told: asyncio.Queue[tuple[list[McpTool], list[McpTool]]] = asyncio.Queue()

    async def changed(added: list[McpTool], removed: list[McpTool]) -> None:
        await told.put((added, removed))

    async with McpTools("lab", [parse_spec(server(tmp_path / "calls.jsonl", revision))], changed) as source:
        old_charge = tool(source, "charge")
        await tool(source, "reshape").fn(ToolContext(operation_id="op-1"))
        added, removed = await asyncio.wait_for(told.get(), timeout=20)
        assert sorted(t.name for t in added) == ["charge", "refund_all"]
        assert sorted(t.name for t in removed) == ["charge", "decline"]
        assert old_charge in removed and tool(source, "charge") is not old_charge
        assert "currency" in tool(source, "charge").binding.input_schema["properties"]
        assert tool(source, "charge").binding.digest != old_charge.binding.digest
        assert "decline" not in {t.name for t in source.tools}
        assert told.empty(), "one change, told once"


async def test_a_server_that_never_says_is_listed_again_every_relist_seconds(tmp_path: Path) -> None:
    told: asyncio.Queue[tuple[list[McpTool], list[McpTool]]] = asyncio.Queue()

    async def changed(added: list[McpTool], removed: list[McpTool]) -> None:
        await told.put((added, removed))

    spec = replace(parse_spec(server(tmp_path / "calls.jsonl", None)), relist_seconds=1.0)
    async with McpTools("lab", [spec], changed) as source:
        await tool(source, "reshape").fn(ToolContext(operation_id="op-1"), tell=False)
        added, removed = await asyncio.wait_for(told.get(), timeout=20)
        assert sorted(t.name for t in added) == ["charge", "refund_all"]
        assert sorted(t.name for t in removed) == ["charge", "decline"]
