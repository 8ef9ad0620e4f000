"""Version 1 of a tool (route "greet"), for the test of an upgrade that keeps pinned threads served."""

from __future__ import annotations

from hands import ToolContext, tool


@tool(route="greet", version="1", replay="safe", name="greet")
async def greet_v1(ctx: ToolContext, who: str) -> dict[str, object]:
    """Greet someone."""
    return {"text": f"hello {who}", "version": 1}
