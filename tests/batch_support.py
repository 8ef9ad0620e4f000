"""What the batch tests with real processes share: their world, the agent that makes one batch
call, and reads of its rows and of the tool's log (tests.batch_tools)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from tests.support import Observer, TendonEnv, run_cli

BRAIN = ["-m", "brain", "serve"]
HANDS = ["-m", "hands", "serve", "--route", "bulk", "--tools", "tests.batch_tools"]


def world(tendon: TendonEnv, tmp_path: Path) -> dict[str, str]:
    tendon.routes.add("bulk")
    return {**tendon.env, "BATCH_LOG_FILE": str(tmp_path / "log"), "BATCH_DONE_DIR": str(tmp_path)}


async def submit(env: dict[str, str], tmp_path: Path, args: dict[str, Any]) -> str:
    script = [{"tool_calls": [{"tool": "batch", "args": args}]}, {"content": "done: {results}"}]
    agent = {"name": "batcher", "version": "1", "tools": ["batch", "step", "blind"],
             "model": {"kind": "scripted", "script": script}}  # fmt: skip
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(agent), encoding="utf-8")
    command = ["-m", "brain", "submit", "--session", "s", "--request-id", "r1", "--agent", str(path), "go"]
    code, out, err = await run_cli(command, env)
    assert code == 0, err
    return out.strip()


async def batch_row(obs: Observer, turn_id: str) -> Any:
    (row,) = [e for e in await obs.executions(turn_id) if e["tool"] == "batch"]
    return row


def effects(log: list[tuple[str, str, int, float]]) -> Counter[str]:
    return Counter(op for what, op, _, _ in log if what == "effect")
