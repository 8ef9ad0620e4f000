"""Tools of your own: route "hello". They only read, so running them again after a crash is
harmless (safe)."""

import asyncio

from hands import ToolContext, tool


@tool(route="hello", version="1", replay="safe")
async def greet(ctx: ToolContext, name: str) -> dict[str, str]:
    """Greet someone; the JSON Schema the model sees comes from the type hints."""
    return {"greeting": f"Hello, {name}!", "operation_id": ctx.operation_id}


@tool(route="hello", version="1", replay="safe")
async def count(ctx: ToolContext, to: int, every: float = 0.5) -> dict[str, int]:
    """Count up to ``to``, one number every ``every`` seconds. Each number goes out as output while
    the tool runs (`brain watch`, the console); a cancel stops it at once."""
    for n in range(1, to + 1):
        await ctx.output.write(f"{n}\n")
        try:  # the next number, or a cancel, whichever comes first
            await asyncio.wait_for(ctx.cancelled.wait(), every)
        except TimeoutError:
            continue
        raise asyncio.CancelledError(f"cancelled after counting to {n}")
    return {"counted": to}
