"""Trivial tools for the benchmark's Hands pools (route ``bench``)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from hands import ToolContext, tool


@tool(route="bench", version="1", replay="safe")
async def noop(ctx: ToolContext, n: int = 0) -> dict[str, int]:
    """Do nothing: the measured cost is Tendon's own."""
    return {"n": n}


@tool(route="bench", version="1", replay="safe")
async def blob(ctx: ToolContext, size: int) -> dict[str, object]:
    """Return ``size`` bytes of text, so big results travel through S3."""
    return {"blob": "x" * size, "size": size}


def _gate(name: str) -> Path:
    return Path(os.environ.get("BENCH_GATE_DIR", "/tmp")) / name


def _started(gate: str) -> None:
    """Record that the body started, and in which process (one line per start)."""
    with open(_gate(f"{gate}.started"), "a") as f:
        f.write(f"{os.getpid()} {time.time()}\n")


async def _wait_gate(ctx: ToolContext, gate: str, poll: float = 0.05) -> None:
    path = _gate(gate)
    while not path.exists():
        await asyncio.sleep(poll)


@tool(route="bench", version="1", replay="safe")
async def sleepy_safe(ctx: ToolContext, gate: str) -> dict[str, str]:
    """Mark that the body started (a file), then wait until the gate file exists."""
    _started(gate)
    await _wait_gate(ctx, gate)
    return {"gate": gate, "attempt": str(ctx.attempt)}


@tool(route="bench", version="1", replay="unsafe")
async def sleepy_unsafe(ctx: ToolContext, gate: str) -> dict[str, str]:
    """Like ``sleepy_safe`` but never re-run: without a query, a crash inside makes it UNKNOWN."""
    _started(gate)
    await _wait_gate(ctx, gate)
    return {"gate": gate}


@tool(route="bench", version="1", replay="safe")
async def wait_gate(ctx: ToolContext, gate: str) -> dict[str, str]:
    """Answer only once the gate file exists (the 'waiting' scenario); polls slowly."""
    await _wait_gate(ctx, gate, poll=0.2)
    return {"gate": gate}
