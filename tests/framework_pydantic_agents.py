"""A Pydantic AI agent whose tools the framework-tool tests serve on route ``fw``; their policies
come from ``@policy`` (on either side of the framework's decorator)."""

from __future__ import annotations

import asyncio

from pydantic_ai import Agent, FunctionToolset, RunContext

from hands.tools.declare import Found, NotFound, ToolContext, current_context, policy
from tests.framework_notes import Answer, note, noted

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


@lab.tool_plain(requires_approval=True)
@policy(route="fw")
async def refund(amount: int) -> str:
    """Asks a person first, in the framework's own terms."""
    return f"refunded {amount}"


@lab.tool_plain
def history(ctx_free: int = 1) -> str:
    """Reads what a Hands pool cannot give: left on the default route."""
    return str(ctx_free)
