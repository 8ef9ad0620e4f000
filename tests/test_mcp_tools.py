"""MCP servers as a tool source, in this process: specs and config files, the replay policy a
listing implies, results, and discovery against a real stdio server (``tests/mcp_server.py``)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from mcp_types import CallToolResult, TextContent, Tool, ToolAnnotations

from hands.tools.declare import Found, NotFound, ToolContext
from hands.tools.mcp import McpToolError, replay_policy, result_of
from hands.tools.mcp_config import McpConfigError, load_config, parse_spec, server_specs
from hands.tools.mcp_pool import McpTools
from hands.tools.registry import ToolLoadError
from protocol import ReplayPolicy, SchemaError
from tests.support import run_cli, wait_for


def listed(name: str, **hints: bool) -> Tool:
    return Tool(name=name, input_schema={"type": "object"}, annotations=ToolAnnotations(**hints))


def test_a_spec_is_a_stdio_command_line_or_a_url() -> None:
    assert parse_spec("stdio:python -m srv --flag 'a b'").command == ("python", "-m", "srv", "--flag", "a b")
    assert parse_spec("https://mcp.example/mcp").url == "https://mcp.example/mcp"
    with pytest.raises(McpConfigError, match="neither"):
        parse_spec("python -m srv")
    assert [s.name for s in server_specs(["stdio:a", "stdio:b"], None)] == ["mcp1", "mcp2"]


def test_a_config_file_names_servers_headers_from_the_environment_and_overrides(tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    servers = {
        "files": {"command": ["python", "-m", "files"], "env": {"ROOT": "/srv"}},
        "billing": {
            "url": "https://billing.example/mcp",
            "headers_from_env": {"Authorization": "BILLING_AUTH"},
            "connections": 2,
            "relist_seconds": 30,
            "tools": {"refund": {"replay": "safe"}},
        },
    }
    config.write_text(json.dumps({"servers": servers}))
    files, billing = load_config(str(config))
    assert files.command == ("python", "-m", "files") and files.env == {"ROOT": "/srv"}
    assert billing.headers_from_env == {"Authorization": "BILLING_AUTH"} and billing.connections == 2
    assert billing.replay == {"refund": ReplayPolicy.SAFE}
    assert billing.relist_seconds == 30.0 and files.relist_seconds is None
    for wrong in (0, "60", True):
        config.write_text(json.dumps({"servers": {"x": {"url": "http://b", "relist_seconds": wrong}}}))
        with pytest.raises(McpConfigError, match="relist_seconds must be"):
            load_config(str(config))
    config.write_text(json.dumps({"servers": {"x": {"command": ["a"], "url": "http://b"}}}))
    with pytest.raises(McpConfigError, match="exactly one of command"):
        load_config(str(config))
    config.write_text(json.dumps({"servers": {"x": {"url": "http://b", "headers": {"A": "secret"}}}}))
    with pytest.raises(McpConfigError, match="unknown keys: headers"):
        load_config(str(config))


def test_only_a_read_only_tool_is_safe_unless_the_config_says_otherwise() -> None:
    assert replay_policy(listed("a", readOnlyHint=True), {}) is ReplayPolicy.SAFE
    assert replay_policy(listed("b", idempotentHint=True), {}) is ReplayPolicy.UNSAFE
    assert replay_policy(Tool(name="c", input_schema={"type": "object"}), {}) is ReplayPolicy.UNSAFE
    assert replay_policy(listed("a", readOnlyHint=True), {"a": ReplayPolicy.UNSAFE}) is ReplayPolicy.UNSAFE


def test_a_result_keeps_content_and_structured_content_and_is_error_is_a_tool_error() -> None:
    ok = CallToolResult(content=[TextContent(type="text", text="hi")], structured_content={"n": 1})
    assert result_of(ok) == {"content": [{"type": "text", "text": "hi"}], "structuredContent": {"n": 1}}
    bad = CallToolResult(content=[TextContent(type="text", text="no funds")], is_error=True)
    with pytest.raises(McpToolError, match="no funds"):
        result_of(bad)


async def test_discovery_binds_each_listed_tool_with_its_schema_query_and_policy(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    spec = parse_spec(f"stdio:{sys.executable} -m tests.mcp_server --log {log}")
    async with McpTools("lab", [spec]) as source:
        tools = {t.name: t for t in source.tools}
        pay, lookup, charge = tools["pay"], tools["lookup"], tools["charge"]
        assert pay.binding.has_query and pay.query is not None and pay.binding.replay_policy == "unsafe"
        assert lookup.binding.replay_policy == "safe" and charge.idempotent
        assert lookup.binding.input_schema["properties"]["key"]["type"] == "string"
        with pytest.raises(SchemaError, match="key"):
            lookup.validate_args({"key": 3})
        ctx = ToolContext(operation_id="op-1")
        assert await pay.query(ctx) == NotFound()
        paid = await pay.fn(ctx, amount=4)
        assert paid["structuredContent"] == {"paid": 4, "receipt": "r-op-1"}
        assert await pay.query(ctx) == Found({"content": [], "structuredContent": paid["structuredContent"]})
    # The server saw the execution id as the operation id in the request's _meta.
    assert [json.loads(x)["op"] for x in log.read_text().splitlines()] == ["op-1", "op-1"]


async def test_two_servers_that_list_the_same_tool_name_cannot_share_a_route(tmp_path: Path) -> None:
    command = f"stdio:{sys.executable} -m tests.mcp_server --log {tmp_path / 'calls.jsonl'}"
    with pytest.raises(ToolLoadError, match="both list a tool named lookup"):
        async with McpTools("lab", server_specs([command, command], None)):
            pass


async def test_hands_serve_says_in_one_line_what_is_wrong_with_its_mcp_servers(tmp_path: Path) -> None:
    code, _, err = await run_cli(["-m", "hands", "serve", "--route", "lab", "--mcp", "srv"], {})
    assert code == 2 and err.strip().startswith("hands: --mcp 'srv' is neither")
    missing = f"stdio:{sys.executable} -c pass"
    code, _, err = await run_cli(["-m", "hands", "serve", "--route", "lab", "--mcp", missing], {})
    assert code == 2 and len(err.strip().splitlines()) == 1 and "cannot connect to MCP server mcp" in err


def test_a_listing_binds_the_same_way_every_time_and_a_changed_tool_is_a_new_binding() -> None:
    from hands.tools.mcp import ServerCalls, bind_tool
    from hands.tools.mcp_client import McpConnection

    spec = parse_spec("stdio:unused")
    calls = ServerCalls(McpConnection(spec))

    def bound(tool: Tool) -> str:
        return bind_tool("lab", spec, calls, tool, {tool.name}).binding.digest

    first = listed("lookup", readOnlyHint=True)
    assert bound(first) == bound(listed("lookup", readOnlyHint=True)), "a restart announces the same binding"
    wider = Tool(name="lookup", input_schema={"type": "object", "properties": {"k": {"type": "string"}}})
    assert bound(wider) != bound(first)
    assert bound(listed("lookup", readOnlyHint=False)) != bound(first)


async def test_a_body_cancelled_mid_call_leaves_no_call_going_on_behind_it(tmp_path: Path) -> None:
    log, gate = tmp_path / "calls.jsonl", tmp_path / "gate"
    spec = parse_spec(f"stdio:{sys.executable} -m tests.mcp_server --log {log} --gate {gate}")
    async with McpTools("lab", [spec]) as source:
        (charge,) = [t for t in source.tools if t.name == "charge"]
        body = asyncio.create_task(charge.fn(ToolContext(operation_id="op-c"), amount=1))

        async def calling() -> bool:
            return log.exists() and "charge" in log.read_text()

        await wait_for(calling, timeout=30, what="the call to reach the server")
        body.cancel()  # as a drain out of grace, or a worker presumed dead, cancels it
        await asyncio.gather(body, return_exceptions=True)
        await asyncio.sleep(0.2)
        behind = [t for t in asyncio.all_tasks() if "_Calls._start" in repr(t.get_coro()) and not t.done()]
        assert behind == []
