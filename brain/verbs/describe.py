"""What the CLI shows of a turn: one read of everything about it, and its human rendering."""

from __future__ import annotations

from typing import Any

from brain.rules.history import ThreadHistory
from brain.store import BrainStore
from protocol import NotFoundError


async def describe(store: BrainStore, namespace: str, turn_id: str) -> dict[str, Any]:
    """Everything `show` prints, as plain data: the turn's row, its executions, and what its
    journal entries say (its conversation, and how many runs it took)."""
    view = await store.read(lambda conn: store.views.turn_view(conn, namespace, turn_id))
    if view is None:
        raise NotFoundError(f"there is no turn {turn_id!r}")
    t, entries, exes = view.turn, view.entries, view.executions
    history = ThreadHistory()
    history.extend(entries, {e["id"]: e for e in exes}, t.thread_id)
    runs = sum(1 for entry in entries for fact in entry.facts if fact.get("kind") == "turn.run_started")
    return {
        "turn_id": t.id,
        "session_id": t.session_id,
        "thread": t.thread_id.removeprefix(t.session_id).removeprefix("/") or "main",
        "revision": t.revision,
        "request_id": t.request_id,
        "status": str(t.status),
        "phase": str(t.phase),
        "waiting_for": t.waiting_for,
        "runs": runs,
        "result": t.result,
        "error": t.error,
        "history": [{"role": m.role, **m.content} for m in history.messages],
        "executions": [
            {
                k: e[k]
                for k in (
                    "id",
                    "call_id",
                    "tool",
                    "route",
                    "status",
                    "attempts",
                    "how",
                    "evidence",
                    "result",
                    "error",
                    "last_seq",
                )
            }
            for e in exes
        ],
    }
