"""Tools for the console's browser tests (route "desk"): a report that writes its output line by
line and waits for the test before its last line, a payment every call of which waits for a
person's approval, and a letter whose first posting takes its whole process down right after it
acted (an unsafe tool with no query: its execution is then UNKNOWN until reconciled)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from hands import ToolContext, tool


@tool(route="desk", version="1", replay="safe")
async def write_report(ctx: ToolContext, lines: int, gate: str = "") -> dict[str, int]:
    """Write ``lines`` lines of output; with ``gate``, wait for that file before the last one."""
    for n in range(1, lines + 1):
        if n == lines and gate:
            # A file the test creates once it saw the lines before: nothing to wait on but time.
            while not await asyncio.to_thread(os.path.exists, gate):  # noqa: ASYNC110
                if ctx.cancelled.is_set():
                    raise asyncio.CancelledError("cancel requested")
                await asyncio.sleep(0.05)
        await ctx.output.write(f"line {n} of {lines}\n")
    return {"lines": lines}


@tool(route="desk", version="1", replay="unsafe", approval=True)
async def pay(ctx: ToolContext, amount: int, to: str) -> dict[str, object]:
    """Pay someone: every call waits for a person's approval."""
    return {"paid": amount, "to": to}


@tool(route="desk", version="1", replay="unsafe")
async def post_letter(ctx: ToolContext, to: str, marker: str) -> dict[str, str]:
    """Post a letter. The first time (no ``marker`` file yet) the process dies right after
    posting, before anything is saved: nobody can tell whether the letter went."""
    if not await asyncio.to_thread(Path(marker).exists):
        await asyncio.to_thread(Path(marker).write_text, "posted once")
        os.kill(os.getpid(), signal.SIGKILL)
    return {"posted_to": to}
