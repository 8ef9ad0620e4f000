"""A tool of your own: route "hello"; it only reads, so running it again is harmless (safe)."""

from hands import ToolContext, tool


@tool(route="hello", version="1", replay="safe")
async def greet(ctx: ToolContext, name: str) -> dict[str, str]:
    """Greet someone; the JSON Schema the model sees comes from the type hints."""
    return {"greeting": f"Hello, {name}!", "operation_id": ctx.operation_id}
