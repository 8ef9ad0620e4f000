"""A turn's history as people read it, made from its journal entries (invariant 16: nothing is
kept beside them): its runs, its steps (one per committed change) and its model calls, each
attempt with its latency and token usage, and the ones lost with a Brain that died (LOST: nothing
of their reply was recorded, and their usage is not known; nothing is invented for them). Each
step says in words what its facts mean (``brain.rules.words``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from brain.rules.states import TurnPhase
from brain.rules.words import said
from brain.store import Entry

LEFT = ("waiting", "paused")


def turn_history(entries: Iterable[Entry]) -> dict[str, list[dict[str, Any]]]:
    """``runs``, ``steps`` and ``model_calls`` of a turn, from its journal entries in order."""
    runs: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    number, attempt = 1, 1
    for entry in entries:
        at = entry.created_at.isoformat() if entry.created_at is not None else None
        kinds = [str(f.get("kind")) for f in entry.facts]
        steps.append(
            {"seq": entry.seq, "at": at, "status": entry.status, "phase": entry.phase, "facts": kinds,
             "said": [said(f) for f in entry.facts]}
        )  # fmt: skip
        for fact in entry.facts:
            kind = fact.get("kind")
            if kind == "turn.run_started":
                if runs and runs[-1]["ended"] is None:
                    runs[-1]["ended"] = "handed over"
                runs.append(
                    {"run": fact["run"], "epoch": fact["epoch"], "began_at": fact["phase"],
                     "owner": fact["owner"], "at": at, "ended": None}
                )  # fmt: skip
            elif kind == "turn.run_lost":
                if runs and runs[-1]["ended"] is None:
                    runs[-1]["ended"] = f"its Brain {fact['how']} at phase {fact['phase']}"
                if fact["phase"] == TurnPhase.MODEL_REQUEST:
                    calls.append({"number": number, "attempt": attempt, "status": "LOST", "at": at})
                    attempt += 1
            elif kind == "turn.retry_scheduled" and entry.phase == TurnPhase.MODEL_REQUEST:
                calls.append(
                    {"number": number, "attempt": attempt, "status": "failed", "error": fact.get("error"),
                     "retry_in_seconds": fact.get("in_seconds"), "at": at}
                )  # fmt: skip
                attempt += 1
            elif kind == "turn.model_replied":
                call = fact.get("call") or {}
                calls.append(
                    {"number": call.get("number", number), "attempt": attempt, "status": "replied",
                     "latency_ms": call.get("latency_ms"), "model": call.get("model"),
                     "usage": fact.get("usage") or {},
                     "tool_calls": len(fact["message"].get("tool_calls") or []), "at": at}
                )  # fmt: skip
                number, attempt = call.get("number", number) + 1, 1
            elif (
                kind in ("turn.completed", "turn.failed", "turn.cancelled")
                and runs
                and runs[-1]["ended"] is None
            ):
                runs[-1]["ended"] = kind.removeprefix("turn.")
        # A run that leaves its turn waiting or paused gives its lease up there: it ended.
        if entry.status in LEFT and runs and runs[-1]["ended"] is None and entry.run == runs[-1]["epoch"]:
            runs[-1]["ended"] = f"left the turn {entry.status}"
    return {"runs": runs, "steps": steps, "model_calls": calls}
