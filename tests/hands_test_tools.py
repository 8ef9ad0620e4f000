"""Tools of route ``lab`` for the Hands tests; they record what they do in files.

- ``LAB_RUNS_FILE``: every tool body appends ``<tool> <operation id> <attempt>`` (one line per
  run), so a test can count runs across processes;
- ``LAB_CHARGES_FILE``: the "external system" of ``charge``: a JSON object keyed by operation
  id. ``find_charge`` (its query) reads it; without the variable the query cannot answer.
- ``LAB_GATE_DIR``: ``gated`` waits inside its body until a file named after its ``gate``
  argument exists there, so a test can hold a body in flight while it injects a fault.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from hands.tools.declare import Found, NotFound, ToolContext, tool


def _record_run(name: str, ctx: ToolContext) -> None:
    path = os.environ.get("LAB_RUNS_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{name} {ctx.operation_id} {ctx.attempt}\n")


def runs(path: Path) -> list[tuple[str, str, int]]:
    """The runs recorded in a runs file: (tool, operation id, attempt)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        name, op, attempt = line.split()
        out.append((name, op, int(attempt)))
    return out


def _charges() -> tuple[Path, dict[str, Any]]:
    path = os.environ.get("LAB_CHARGES_FILE")
    if not path:
        raise RuntimeError("the charges service is not configured (LAB_CHARGES_FILE)")
    p = Path(path)
    return p, (json.loads(p.read_text(encoding="utf-8")) if p.exists() else {})


def _store_charge(operation_id: str, amount: int) -> dict[str, Any]:
    path, charges = _charges()
    receipt = {"charge_id": f"ch_{operation_id[:8]}", "amount": amount}
    charges[operation_id] = receipt
    path.write_text(json.dumps(charges), encoding="utf-8")
    return receipt


@tool(route="lab", version="1", replay="safe")
async def echo(ctx: ToolContext, text: str) -> dict:
    """Return the text (safe: running it twice is harmless)."""
    _record_run("echo", ctx)
    return {"text": text, "attempt": ctx.attempt}


async def find_charge(ctx: ToolContext, amount: int) -> Found | NotFound:
    """Ask the charges service about this operation id."""
    _, charges = _charges()
    receipt = charges.get(ctx.operation_id)
    return Found(receipt) if receipt is not None else NotFound()


@tool(route="lab", version="1", replay="unsafe", query=find_charge)
async def charge(ctx: ToolContext, amount: int) -> dict:
    """Charge an amount (unsafe; the query asks the charges service by operation id)."""
    _record_run("charge", ctx)
    return _store_charge(ctx.operation_id, amount)


@tool(route="lab", version="1", replay="unsafe")
async def charge_noquery(ctx: ToolContext, amount: int) -> dict:
    """Charge an amount through a service that cannot be asked afterwards."""
    _record_run("charge_noquery", ctx)
    return {"charged": amount}


@tool(route="lab", version="1", replay="safe")
async def slow(ctx: ToolContext, pages: int = 3, delay: float = 0.05) -> dict:
    """Write ``pages`` output pages, ``delay`` seconds apart."""
    _record_run("slow", ctx)
    for i in range(pages):
        await ctx.output.write(f"page {i}\n")
        await asyncio.sleep(delay)
    return {"pages": pages}


@tool(route="lab", version="1", replay="safe")
async def progress(ctx: ToolContext, lines: int, every: float, big_at: int = -1, big_size: int = 0) -> dict:
    """Write ``lines`` lines of output, ``every`` seconds apart; before line ``big_at``, a page of
    ``big_size`` bytes (to cross the offload threshold)."""
    _record_run("progress", ctx)
    for i in range(1, lines + 1):
        if i == big_at:
            await ctx.output.write("#" * (big_size - 1) + "\n")
        await ctx.output.write(f"attempt {ctx.attempt} line {i}\n")
        await asyncio.sleep(every)
    return {"lines": lines}


@tool(route="lab", version="1", replay="safe")
async def big(ctx: ToolContext, size: int) -> dict:
    """Return a result of about ``size`` bytes (to cross the offload threshold)."""
    _record_run("big", ctx)
    return {"blob": "x" * size}


@tool(route="lab", version="1", replay="safe")
async def wait_cancel(ctx: ToolContext, seconds: float = 15.0) -> dict:
    """Wait until cancelled (then stop with CancelledError), or give up after ``seconds``."""
    _record_run("wait_cancel", ctx)
    await ctx.output.write("waiting for a cancel\n")
    try:
        await asyncio.wait_for(ctx.cancelled.wait(), seconds)
    except TimeoutError:
        return {"cancelled": False}
    raise asyncio.CancelledError()


@tool(route="lab", version="1", replay="safe")
async def boom(ctx: ToolContext, message: str, nul: bool = False) -> dict:
    """Always raise (with a NUL appended to the message if ``nul``: text PostgreSQL refuses)."""
    _record_run("boom", ctx)
    raise ValueError(message + ("\x00" if nul else ""))


@tool(route="lab", version="1", replay="unsafe")
async def nul_result(ctx: ToolContext, text: str) -> dict:
    """Return ``text`` with a NUL appended: valid JSON, but PostgreSQL jsonb refuses it."""
    _record_run("nul_result", ctx)
    return {"text": text + "\x00"}


@tool(route="lab", version="1", replay="unsafe")
async def gated(ctx: ToolContext, gate: str) -> dict:
    """Wait until the test opens ``gate``, then act once (unsafe, no query: after a crash in
    here nobody can tell whether it acted)."""
    _record_run("gated", ctx)
    opened = Path(os.environ["LAB_GATE_DIR"]) / gate
    # A file another process creates: there is nothing to wait on but time.
    while not opened.exists():  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    return {"acted": gate, "attempt": ctx.attempt}


@tool(route="lab", version="1", replay="unsafe")
async def gated_effect(ctx: ToolContext, gate: str) -> dict:
    """Wait until the test opens ``gate``, then act once, as a careful tool does: only after
    ``ctx.ensure_owner()`` said this worker still owns the execution."""
    opened = Path(os.environ["LAB_GATE_DIR"]) / gate
    while not opened.exists():  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    await ctx.ensure_owner()
    _record_run("gated_effect", ctx)
    return {"acted": gate}


async def find_gated_charge(ctx: ToolContext, amount: int, gate: str) -> Found | NotFound:
    """Ask the charges service about this operation id."""
    return await find_charge(ctx, amount)


@tool(route="lab", version="1", replay="unsafe", query=find_gated_charge)
async def gated_charge(ctx: ToolContext, amount: int, gate: str) -> dict:
    """Charge once the test opens ``gate``, as a careful tool does: only after
    ``ctx.ensure_owner()`` said this worker still owns the execution (unsafe, with a query)."""
    opened = Path(os.environ["LAB_GATE_DIR"]) / gate
    while not opened.exists():  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    await ctx.ensure_owner()
    _record_run("gated_charge", ctx)
    return _store_charge(ctx.operation_id, amount)


@tool(route="other", version="1", replay="safe")
async def elsewhere(ctx: ToolContext) -> None:
    """A tool of another route: a pool of route lab must not serve it."""
