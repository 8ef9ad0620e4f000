"""An OpenAI Agents SDK agent whose tools the framework-tool tests serve on route ``fw``; their
policies come from ``TENDON_TOOLS``."""

from __future__ import annotations

from typing import Any

from agents import Agent as SdkAgent
from agents import function_tool
from agents.tool_context import ToolContext as SdkToolContext

from hands.tools.declare import current_context
from tests.framework_notes import Answer, note


@function_tool
def sdk_effect(key: str) -> dict[str, str]:
    """An SDK effect nobody can ask about."""
    note("sdk_effect", key=key, op=current_context().operation_id)
    return {"key": key, "done": "yes"}


@function_tool
async def sdk_lookup(ctx: SdkToolContext[None], key: str) -> Answer:
    """Read-only, with the SDK's ToolContext."""
    note("sdk_lookup", key=key, op=ctx.tool_call_id, name=ctx.tool_name)
    return Answer(key=key, value=key.upper())


@function_tool
def sdk_boom(reason: str) -> str:
    """Always fails."""
    raise ValueError(f"boom: {reason}")


@function_tool(failure_error_function=lambda ctx, exc: f"handled: {exc}", needs_approval=True)
def sdk_handled(reason: str) -> str:
    """Fails, with its own failure text."""
    raise ValueError(reason)


@function_tool(needs_approval=True)
def sdk_refund(amount: int) -> str:
    """Asks a person first, in the SDK's own terms."""
    return f"refunded {amount}"


@function_tool
def sdk_elsewhere() -> str:
    """Served by another route."""
    return "elsewhere"


helper = SdkAgent(name="helper", instructions="Help.")
ask_helper = helper.as_tool(tool_name="ask_helper", tool_description="An agent as a tool: not served")

TOOLS = [sdk_effect, sdk_lookup, sdk_boom, sdk_handled, sdk_refund, sdk_elsewhere, ask_helper]
sdk = SdkAgent(name="lab-sdk", tools=list(TOOLS))

TENDON_TOOLS: dict[str, dict[str, Any]] = {
    "sdk_effect": {"route": "fw", "replay": "unsafe"},
    "sdk_lookup": {"route": "fw", "replay": "safe"},
    "sdk_boom": {"route": "fw"},
    "sdk_handled": {"route": "fw", "approval": False},  # the mapping overrides the SDK's flag
    "sdk_refund": {"route": "fw"},
    "sdk_elsewhere": {"route": "other", "replay": "safe"},
}
