"""Version 2 of the greet tool, served beside version 1 so that threads pinned to 1 keep working."""

from __future__ import annotations

from hands import ToolContext, tool
from tests.greet_tools_v1 import greet_v1  # noqa: F401 - served too: the threads pinned to it


@tool(route="greet", version="2", replay="safe", name="greet")
async def greet_v2(ctx: ToolContext, who: str, loud: bool = False) -> dict[str, object]:
    """Greet someone, loudly if asked."""
    text = f"hello {who}"
    return {"text": text.upper() if loud else text, "version": 2}
