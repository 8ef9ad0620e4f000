"""When a pool lists an MCP server's tools again, in this process against a real stdio server
(``tests/mcp_server.py``): every ``--mcp-relist`` seconds for ``--mcp`` servers, when a server
started anew lists other tools, and a listen stream that keeps ending is given up."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from hands.tools import mcp_client
from hands.tools.declare import ToolContext
from hands.tools.mcp import McpTool
from hands.tools.mcp_client import McpConnection
from hands.tools.mcp_config import McpConfigError, server_specs
from hands.tools.mcp_pool import McpTools
from tests.support import run_cli, wait_for


def server(log: Path, *more: str) -> str:
    return " ".join([f"stdio:{sys.executable} -m tests.mcp_server --log {log}", *more])


def logged(log: Path, event: str) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in log.read_text().splitlines() if x] if log.exists() else []
    return [r for r in lines if r["event"] == event]


class Changes:
    """What the pool was told a re-listing changed."""

    def __init__(self) -> None:
        self.added: list[str] = []
        self.removed: list[str] = []

    async def __call__(self, added: list[McpTool], removed: list[McpTool]) -> None:
        self.added += [t.name for t in added]
        self.removed += [t.name for t in removed]


def test_mcp_relist_gives_the_mcp_servers_a_relist_time_and_is_refused_when_it_cannot_apply() -> None:
    one, two = server_specs(["stdio:srv-a", "https://b.example/mcp"], None, relist=30)
    assert one.relist_seconds == two.relist_seconds == 30.0
    assert server_specs(["stdio:srv-a"], None)[0].relist_seconds is None
    for bad in (0.5, 0, -3, float("nan")):
        with pytest.raises(McpConfigError, match="at least 1"):
            server_specs(["stdio:srv-a"], None, relist=bad)
    with pytest.raises(McpConfigError, match="for --mcp servers"):
        server_specs([], None, relist=10)


async def test_hands_serve_says_in_one_line_what_is_wrong_with_mcp_relist() -> None:
    code, out, err = await run_cli(
        ["-m", "hands", "serve", "--route", "x", "--mcp", "stdio:srv", "--mcp-relist", "0.2"],
        dict(os.environ),
    )
    assert code == 2 and out == ""
    assert err.strip() == "hands: --mcp-relist 0.2 must be a number of seconds, at least 1", err


async def test_an_mcp_server_given_by_mcp_is_listed_again_every_relist_seconds(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    (spec,) = server_specs([server(log)], None, relist=1)
    changes = Changes()
    async with McpTools("lab", [spec], on_change=changes) as source:
        (reshape,) = [t for t in source.tools if t.name == "reshape"]
        await reshape.fn(ToolContext(operation_id="op-r"), tell=False)  # says nothing of it

        async def heard() -> bool:
            return "refund_all" in changes.added

        await wait_for(heard, timeout=10, what="the quiet change to be found by a re-listing")
        assert sorted(changes.removed) == ["charge", "decline"] and "charge" in changes.added


async def test_a_server_started_anew_is_listed_again_and_its_other_tools_are_served(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    (spec,) = server_specs([server(log)], None)  # no relist time: only a reconnect can tell
    changes = Changes()
    async with McpTools("lab", [spec], on_change=changes) as source:
        tools = {t.name: t for t in source.tools}
        await tools["reshape"].fn(ToolContext(operation_id="op-r"), tell=False, keep=True)
        await asyncio.sleep(1.0)
        assert changes.added == [], "nothing said, nothing listed again"
        (first,) = logged(log, "call")
        os.kill(first["pid"], signal.SIGKILL)  # the server dies; the one started next is reshaped

        async def served_again() -> bool:
            try:
                await tools["lookup"].fn(ToolContext(operation_id="op-l"), key="k")
            except Exception:  # noqa: BLE001 - the call that finds the server gone
                return False
            return "refund_all" in changes.added

        await wait_for(served_again, timeout=20, interval=0.3, what="the new server's tools to be listed")
        assert "decline" in changes.removed
        assert {r["pid"] for r in logged(log, "call")} - {first["pid"]}, "a new server process answered"


async def test_a_listen_stream_that_keeps_ending_is_given_up_until_the_next_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mcp_client, "LISTEN_PAUSE", 0.01)
    log = tmp_path / "calls.jsonl"
    (spec,) = server_specs([server(log, "--listen-fails")], None)
    told: list[int] = []
    connection = McpConnection(spec, changed=lambda: told.append(1))
    try:
        await connection.list_tools()

        async def tries(n: int) -> bool:
            return len(logged(log, "listen")) >= n

        await wait_for(lambda: tries(mcp_client.LISTEN_TRIES), timeout=20, what="the listen streams")
        await asyncio.sleep(1.0)  # far longer than the pauses between tries
        assert len(logged(log, "listen")) == mcp_client.LISTEN_TRIES, "given up: no sixth stream"
        assert told == [], "a refused stream says nothing changed"

        # A new connection (the server started anew) listens again, and lists the tools again
        pid = logged(log, "listen")[0]["pid"]
        os.kill(pid, signal.SIGKILL)

        async def listening_again() -> bool:
            try:
                await connection.list_tools()
            except Exception:  # noqa: BLE001 - the request that finds the server gone
                return False
            return len(logged(log, "listen")) > mcp_client.LISTEN_TRIES

        await wait_for(
            listening_again, timeout=20, interval=0.3, what="a listen stream on the new connection"
        )
        assert told, "a reconnect is a reason to list the tools again"
    finally:
        await connection.close()
