"""Invariant 16, one record per fact: what a turn says is written once, in the journal entry of
the commit that made it so, beside the state rows the hot path needs; nothing keeps a copy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import Observer, Processes, TendonEnv, run_cli

BRAIN = ["-m", "brain", "serve"]
HANDS_BULK = ["-m", "hands", "serve", "--route", "bulk", "--tools", "tests.brain_e2e_tools"]

pytestmark = pytest.mark.chaos

INPUT = "input-marker-5f1c"
ARGUMENT = "argument-marker-9d2e"
REPLY = "reply-marker-7a3b"


async def _occurrences(obs: Observer, schema: str, marker: str) -> dict[str, int]:
    """How many times ``marker`` stands in each table of ``schema`` (every column, as text), but
    for ``agents``: a scripted agent's definition holds the script its model replies from."""
    tables = await obs.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = $1 AND tablename <> 'agents'", schema
    )
    found = {}
    for t in tables:
        name = t["tablename"]
        n = await obs.fetch(
            "SELECT coalesce(sum((length(r::text) - length(replace(r::text, $1, ''))) / length($1)), 0)"
            f' AS n FROM "{schema}"."{name}" AS r',
            marker,
        )
        if n[0]["n"]:
            found[name] = int(n[0]["n"])
    return found


async def test_a_turn_writes_each_fact_once_and_one_journal_entry_per_commit(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    # Given a Brain and a Hands pool, and an agent that calls a tool once and then replies
    tendon.routes.add("bulk")
    agent: dict[str, Any] = {
        "name": "record",
        "version": "1",
        "tools": ["echo_blob"],
        "model": {
            "kind": "scripted",
            "script": [
                {"tool_calls": [{"tool": "echo_blob", "args": {"blob": ARGUMENT}}]},
                {"content": REPLY},
            ],
        },
    }
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(agent))
    await processes.start_ready("brain", BRAIN, tendon.env)
    await processes.start_ready("hands", HANDS_BULK, tendon.env)

    # When a turn runs to its end
    code, out, err = await run_cli(
        ["-m", "brain", "submit", "--session", "s-record", "--request-id", "r", "--agent", str(path), INPUT],
        tendon.env,
    )
    assert code == 0, err
    turn_id = out.strip()
    obs = Observer(tendon)
    await obs.wait_turn(turn_id, "completed")
    brain, hands = tendon.schemas

    # Then the input and the final reply are journal facts and nothing else holds them but the
    # turn's row, whose result is what readers that poll a turn (`brain wait`) read
    assert await _occurrences(obs, brain, INPUT) == {"journal": 1}
    assert await _occurrences(obs, brain, REPLY) == {"journal": 1, "turns": 1}
    # The tool's argument is in the model's reply (journal) and its echo in the execution's
    # result; the command that carried it was let go once the Hands answered. The Hands keep
    # the arguments and their one succeeded event in the execution's row.
    assert await _occurrences(obs, brain, ARGUMENT) == {"journal": 1, "executions": 1}
    assert await _occurrences(obs, hands, ARGUMENT) == {"executions": 2}

    # One journal entry per commit: no two entries of the turn share a transaction
    shared = await obs.fetch(
        "SELECT xmin::text, count(*) AS n FROM {brain}.journal WHERE turn_id = $1"
        " GROUP BY 1 HAVING count(*) > 1",
        turn_id,
    )
    assert shared == []
    # And each fact once, in the order it happened
    kinds = [f["kind"] for f in await obs.facts(turn_id)]
    assert kinds == [
        "turn.accepted",
        "turn.run_started",
        "turn.prepared",
        "turn.model_replied",
        "execution.intended",
        "execution.succeeded",
        "turn.run_started",
        "turn.results_applied",
        "turn.model_replied",
        "turn.completed",
    ]
    # Nothing repeats the journal beside it
    tables = {
        r["tablename"]
        for r in await obs.fetch("SELECT tablename FROM pg_tables WHERE schemaname = $1", brain)
    }
    assert not tables & {"runs", "steps", "history", "model_calls", "public_events"}
