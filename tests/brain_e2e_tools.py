"""Tools for the Brain end-to-end tests (route "bulk"): payloads big enough to go through S3, a
step that takes its time and stops when cancelled, and a step that needs approval. Each records
how its runs ended in ``BULK_RUNS_FILE`` (one line each), when that is set."""

from __future__ import annotations

import asyncio
import os

from hands import ToolContext, tool


def _record(line: str) -> None:
    path = os.environ.get("BULK_RUNS_FILE")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


@tool(route="bulk", version="1", replay="safe")
async def echo_blob(ctx: ToolContext, blob: str) -> dict[str, object]:
    """Return the blob it was given, so arguments and result both cross the offload threshold."""
    return {"blob": blob, "length": len(blob)}


async def _elapsed(seconds: float, gate: str) -> None:
    if not gate:
        await asyncio.sleep(seconds)
        return
    # A file the test creates: there is nothing to wait on but time.
    while not await asyncio.to_thread(os.path.exists, gate):  # noqa: ASYNC110
        await asyncio.sleep(0.05)


@tool(route="bulk", version="1", replay="safe")
async def slow_step(
    ctx: ToolContext, seconds: float, label: str = "step", gate: str = ""
) -> dict[str, object]:
    """Take ``seconds``, or with ``gate`` until that file exists (a test that must act while the
    step runs, however slow its machine); stop as soon as a cancel comes."""
    _record(f"{label} started {ctx.operation_id}")
    elapsed = asyncio.ensure_future(_elapsed(seconds, gate))
    cancelled = asyncio.ensure_future(ctx.cancelled.wait())
    try:
        await asyncio.wait({elapsed, cancelled}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        elapsed.cancel()
        cancelled.cancel()
    if not ctx.cancelled.is_set():
        _record(f"{label} finished {ctx.operation_id}")
        return {"label": label, "slept": seconds}
    _record(f"{label} stopped by a cancel {ctx.operation_id}")
    raise asyncio.CancelledError("cancel requested")


@tool(route="bulk", version="1", replay="unsafe", approval=True)
async def wire_money(ctx: ToolContext, amount: int, to: str) -> dict[str, object]:
    """Move money: every call waits for a person's approval."""
    _record(f"wired {amount} to {to} {ctx.operation_id}")
    return {"wired": amount, "to": to}
