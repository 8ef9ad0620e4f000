"""Agents of both frameworks whose tools the framework-tool tests serve on route ``fw``.

Every body appends a line to the file named by ``FW_TEST_LOG`` (read at each call), so a test
counts what ran across the processes it kills. The Pydantic AI tools get their policies from
``@policy``, the OpenAI Agents SDK tools from ``TENDON_TOOLS``.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from agents import Agent as SdkAgent
from agents import function_tool
from agents.tool_context import ToolContext as SdkToolContext
from pydantic import BaseModel
from pydantic_ai import Agent, FunctionToolset, RunContext

from hands.tools.declare import Found, NotFound, ToolContext, current_context, policy


def note(tool: str, **fields: Any) -> None:
    path = os.environ.get("FW_TEST_LOG")
    if path:
        with open(path, "a") as log:
            log.write(json.dumps({"tool": tool, **fields}) + "\n")


def noted(tool: str) -> list[dict[str, Any]]:
    path = os.environ.get("FW_TEST_LOG") or ""
    if not os.path.exists(path):
        return []
    with open(path) as log:
        return [r for r in map(json.loads, log) if r["tool"] == tool]


class Answer(BaseModel):
    key: str
    value: str


geo = FunctionToolset()


@geo.tool_plain
@policy(route="fw", replay="safe")
def area(width: float, height: float) -> float:
    """A toolset's tool, shown to the model under the prefix its agent gives the toolset."""
    return width * height


spare = FunctionToolset()  # no agent holds it: its tools are served as they are named


@spare.tool_plain
def spare_tool() -> str:
    """A module-level toolset's tool, without a policy."""
    return "spare"


lab = Agent("test", name="lab", toolsets=[geo.prefixed("geo")])


async def was_verified(ctx: ToolContext, key: str) -> Found | NotFound:
    seen = [r for r in noted("verified") if r["op"] == ctx.operation_id]
    return Found({"key": key, "sent": True, "how": "found"}) if seen else NotFound()


@lab.tool_plain
@policy(route="fw", replay="unsafe")
async def effect(key: str) -> dict[str, str]:
    """An effect nobody can ask about."""
    note("effect", key=key, op=current_context().operation_id)
    return {"key": key, "done": "yes"}


@policy(route="fw", replay="unsafe", query=was_verified)
@lab.tool_plain
async def verified(key: str) -> dict[str, str]:
    """An effect its query can find by the operation id."""
    note("verified", key=key, op=current_context().operation_id)
    return {"key": key, "sent": "yes"}


@lab.tool
@policy(route="fw", replay="safe", version="7")
def lookup(ctx: RunContext[None], key: str) -> Answer:
    """Read-only; takes RunContext and runs in a thread."""
    note("lookup", key=key, op=current_context().operation_id, call=ctx.tool_call_id, deps=ctx.deps)
    return Answer(key=key, value=key.upper())


@lab.tool
@policy(route="fw", replay="safe")
def peek(ctx: RunContext[None]) -> int:
    """Reads the run's messages, which live in the Brain."""
    return len(ctx.messages)


@lab.tool_plain
@policy(route="fw", replay="safe")
async def wait_long(seconds: float) -> str:
    """Takes its time; knows nothing of Tendon's cancel signal."""
    note("wait_long", op=current_context().operation_id)
    await asyncio.sleep(seconds)
    return "waited"


@lab.tool_plain
def history(ctx_free: int = 1) -> str:
    """Reads what a Hands pool cannot give: left on the default route."""
    return str(ctx_free)


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


@function_tool(failure_error_function=lambda ctx, exc: f"handled: {exc}")
def sdk_handled(reason: str) -> str:
    """Fails, with its own failure text."""
    raise ValueError(reason)


@function_tool
def sdk_elsewhere() -> str:
    """Served by another route."""
    return "elsewhere"


sdk = SdkAgent(name="lab-sdk", tools=[sdk_effect, sdk_lookup, sdk_boom, sdk_handled, sdk_elsewhere])

TENDON_TOOLS: dict[str, dict[str, Any]] = {
    "sdk_effect": {"route": "fw", "replay": "unsafe"},
    "sdk_lookup": {"route": "fw", "replay": "safe"},
    "sdk_boom": {"route": "fw"},
    "sdk_handled": {"route": "fw", "approval": False},
    "sdk_elsewhere": {"route": "other", "replay": "safe"},
}
