"""Tools for the Brain end-to-end tests (route "bulk"): payloads big enough to go through S3."""

from __future__ import annotations

from hands import ToolContext, tool


@tool(route="bulk", version="1", replay="safe")
async def echo_blob(ctx: ToolContext, blob: str) -> dict[str, object]:
    """Return the blob it was given, so arguments and result both cross the offload threshold."""
    return {"blob": blob, "length": len(blob)}
