"""Tools of route ``bulk`` for the batch tests: they say from the tool's side what ran and when.

- ``BATCH_LOG_FILE``: every body appends ``start <operation id> <n> <time>`` when it begins,
  ``effect ...`` once its effect happened and ``end ...`` when it returns or raises, so a test can
  count runs and effects and measure
  how many bodies were inside at once, across processes (a killed body has no ``end``);
- ``BATCH_DONE_DIR``: the "external system" of ``step``: a file per operation id once its effect
  happened. ``find_step`` (its query) looks there, so a body its worker died in is verified, never
  run again. ``blind`` does the same through a service that cannot be asked (no query).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from hands.tools.declare import Found, NotFound, ToolContext, tool


def _log(what: str, ctx: ToolContext, n: int) -> None:
    path = os.environ.get("BATCH_LOG_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{what} {ctx.operation_id} {n} {time.time():.6f}\n")


def _done_dir() -> Path:
    return Path(os.environ.get("BATCH_DONE_DIR") or ".")


async def find_step(ctx: ToolContext, n: int, delay: float = 0.2, fail: bool = False) -> Found | NotFound:
    """Ask the external system whether this operation happened."""
    path = _done_dir() / ctx.operation_id
    return Found({"n": n, "verified": True}) if path.exists() else NotFound()


@tool(route="bulk", version="1", replay="unsafe", query=find_step)
async def step(ctx: ToolContext, n: int, delay: float = 0.2, fail: bool = False) -> dict[str, Any]:
    """Do step ``n`` (unsafe: its effect is a file named after the operation id), taking
    ``delay`` seconds; ``fail`` raises instead."""
    _log("start", ctx, n)
    try:
        await asyncio.sleep(delay)
        if fail:
            raise ValueError(f"step {n} failed")
        (_done_dir() / ctx.operation_id).write_text(str(n), encoding="utf-8")
        _log("effect", ctx, n)
        return {"n": n}
    finally:
        _log("end", ctx, n)


@tool(route="bulk", version="1", replay="unsafe")
async def blind(ctx: ToolContext, n: int, delay: float = 0.1) -> dict[str, Any]:
    """Do step ``n`` through a service that cannot be asked afterwards (unsafe, no query)."""
    _log("start", ctx, n)
    try:
        await asyncio.sleep(delay)
        _log("effect", ctx, n)
        return {"n": n}
    finally:
        _log("end", ctx, n)


def events(path: Path) -> list[tuple[str, str, int, float]]:
    """The log's lines: (start or end, operation id, n, time)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        what, op, n, at = line.split()
        out.append((what, op, int(n), float(at)))
    return out


def most_at_once(log: list[tuple[str, str, int, float]], killed_at: float | None = None) -> int:
    """How many bodies were inside at once at most; a body with no end (its worker was killed)
    counts until ``killed_at``."""
    ends = {op: at for what, op, _, at in log if what == "end"}
    spans = []
    for what, op, _, at in log:
        if what == "start":
            end = ends.get(op, killed_at if killed_at is not None else float("inf"))
            spans.append((at, end))
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])  # an end before a start
    most = inside = 0
    for _, delta in points:
        inside += delta
        most = max(most, inside)
    return most
