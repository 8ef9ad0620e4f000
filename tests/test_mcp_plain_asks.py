"""A server that asks its client something in the middle of a plain call (not a task): an
elicitation or a sampling request. A Tendon pool has no person or model at hand there, so the call
fails with a tool error that says so and says how to ask instead (a task's ``input_required``).
In this process, against the real stdio server (``tests/mcp_server.py``), at 2026-07-28 (where a
server has no channel to ask on during a call) and pinned to 2025-06-18 (where it asks, and the
pool's client, which declares neither capability, refuses)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hands.tools.declare import ToolContext
from hands.tools.mcp import McpToolError
from hands.tools.mcp_config import parse_spec
from hands.tools.mcp_pool import McpTools


@pytest.mark.parametrize("pin", [None, "2025-06-18"])
async def test_an_elicitation_or_a_sampling_request_during_a_plain_call_is_refused_clearly(
    tmp_path: Path, pin: str | None
) -> None:
    log = tmp_path / "calls.jsonl"
    more = f" --pin {pin}" if pin else ""
    spec = parse_spec(f"stdio:{sys.executable} -m tests.mcp_server --log {log}{more}")
    async with McpTools("lab", [spec]) as source:
        tools = {t.name: t for t in source.tools}
        with pytest.raises(McpToolError, match=r"asked for input \(elicitation/create\) during a plain call"):
            await tools["ask_plainly"].fn(ToolContext(operation_id="op-e"))
        with pytest.raises(
            McpToolError, match=r"sampling/createMessage\) during a plain call of sample_plainly"
        ):
            await tools["sample_plainly"].fn(ToolContext(operation_id="op-s"))
        # The pool goes on: the next call is served
        looked = await tools["picture"].fn(ToolContext(operation_id="op-p"), caption="still here")
        assert looked["structuredContent"]["caption"] == "still here"
