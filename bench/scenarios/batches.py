"""Batch sizes: how much work each shared transaction and each message carries.

Batching across turns only pays where batches form. At 1, 10 and 50 calls in flight (1-call
turns, a Brain and one Hands worker of their own per level), this reads what each process says
of its group committers when it stops (the ``batch_sizes`` log line): the Brain's claims (turns
per claim), moves (runs' replies, intents and endings per transaction) and update applies
(event ranges per transaction), the Hands' ledger commits (accepts, starts and outcomes per
transaction), the events per message the Hands relay sent and the commands per message the Brain's
relay sent. Not timed, and not metered: the
processes log at INFO here, which the throughput scenario's CPU figures must not pay for.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bench.harness import TendonWorld
from bench.scenarios.base import Context, Result, Row
from bench.scenarios.throughput import tendon_closed_loop

LEVELS = (1, 10, 50)
COMMITTERS = {
    "submits": "Brain: submits per transaction (served by its API)",
    "claims": "Brain: turns per claim",
    "moves": "Brain: run moves per transaction (replies, intents, endings)",
    "updates": "Brain: event ranges applied per transaction",
    "ledger": "Hands: ledger changes per transaction (accepts, starts, outcomes)",
}


def mean_size(sizes: Mapping[str, int]) -> float | None:
    """Items per batch over batches that carried any (a claim that found nothing is not one)."""
    batches = sum(n for size, n in sizes.items() if int(size) > 0)
    items = sum(int(size) * n for size, n in sizes.items())
    return items / batches if batches else None


def batch_lines(logs: Iterable[Path]) -> list[dict[str, Any]]:
    """The ``batch_sizes`` records of these JSON log files."""
    found = []
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            if '"batch_sizes"' not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == "batch_sizes":
                found.append(record)
    return found


def summarize(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """Mean batch size per committer, and events per Hands message, over the given records."""
    sizes: dict[str, dict[str, int]] = {}
    messages = events = command_messages = commands = 0
    for record in records:
        stats = json.loads(record["stats"])
        merged = sizes.setdefault(stats["committer"], {})
        for size, n in stats["sizes"].items():
            merged[size] = merged.get(size, 0) + n
        messages += int(record.get("messages", 0))
        events += int(record.get("events", 0))
        command_messages += int(record.get("command_messages", 0))
        commands += int(record.get("commands", 0))
    out: dict[str, float | None] = {name: mean_size(sizes.get(name, {})) for name in COMMITTERS}
    out["events per message"] = events / messages if messages else None
    out["commands per message"] = commands / command_messages if command_messages else None
    return out


async def run(ctx: Context) -> Result:
    res = Result()
    duration = 2.0 if ctx.quick else 10.0
    by_level: dict[int, dict[str, float | None]] = {}
    levels = LEVELS[-1:] if ctx.quick else LEVELS  # quick: the level where batches should form
    for k in levels:
        world = TendonWorld(
            ctx.services, ctx.procs, {"TENDON_LOG_LEVEL": "INFO", "TENDON_SCAN_INTERVAL": "5"}
        )
        try:
            brain = await world.start_brain()
            hands = await world.start_hands()
            await world.open()
            await tendon_closed_loop(world, k, duration)
            for proc in (brain, hands):
                ctx.procs.stop(proc)  # SIGTERM: each logs its batch sizes on the way out
            by_level[k] = summarize(batch_lines(p.log_path for p in (brain, hands)))  # type: ignore[attr-defined]
        finally:
            await world.cleanup()
    per_message = [
        ("events per message", "Hands: events per message"),
        ("commands per message", "Brain: commands per message"),
    ]
    for key, label in [*COMMITTERS.items(), *per_message]:
        for k in levels:
            res.rows.append(
                Row(
                    "batches",
                    f"{label}, {k} in flight",
                    "items",
                    by_level[k].get(key),
                    note="mean over the level's transactions (or messages); 1 means no batching formed",
                )
            )
    res.series["batches"] = {str(k): v for k, v in by_level.items()}
    return res
