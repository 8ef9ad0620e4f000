"""What a turn's delegated children spent, for its history (``brain history``): each child's
turn, thread and end, and its usage with its own children's, read from their journals (invariant
16: nothing is kept beside them). Every model call that replied counts, retries included."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from brain.rules.submits import thread_name
from brain.store import BrainStore, Entry
from brain.verbs.turn_history import turn_history
from infra.db import Connection

DEPTH = 8  # children of children shown at most this deep (a cycle is refused anyway)


def usage_of(calls: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """The model calls that replied, and their usage's counts added up."""
    total: dict[str, int] = {"model_calls": 0}
    for c in calls:
        if c.get("status") != "replied":
            continue
        total["model_calls"] += 1
        for key, value in (c.get("usage") or {}).items():
            if isinstance(value, int):
                total[key] = total.get(key, 0) + value
    return total


def added(*usages: Mapping[str, int]) -> dict[str, int]:
    total: dict[str, int] = {}
    for u in usages:
        for key, value in u.items():
            total[key] = total.get(key, 0) + value
    return total


async def children(
    store: BrainStore, conn: Connection, session_key: str, turn_id: str, depth: int = 0
) -> list[dict[str, Any]]:
    """The turn's delegated calls, each with its child's end and usage (its children's included)."""
    found = []
    for r in await store.delegations.children_of(conn, turn_id):
        child: dict[str, Any] = {
            "execution_id": r["execution_id"], "call_id": r["call_id"], "tool": r["tool"],
            "agent": {"name": r["agent_name"], "version": r["agent_version"]}, "status": r["status"],
            "reason": r["reason"], "child_turn": r["child_turn_id"], "child_status": r["child_status"],
            "child_thread": thread_name(session_key, r["child_thread_id"]) if r["child_thread_id"] else None,
            "usage": {},
        }  # fmt: skip
        if r["child_turn_id"] is not None:
            entries: list[Entry] = await store.journal.entries(
                conn, session_key, turn_id=r["child_turn_id"], limit=100_000
            )
            own = usage_of(turn_history(entries)["model_calls"])
            below = (
                await children(store, conn, session_key, r["child_turn_id"], depth + 1)
                if depth < DEPTH
                else []
            )
            child["usage"] = added(own, *(c["usage"] for c in below))
            child["children"] = below
        found.append(child)
    return found


def rolled_up(history: dict[str, Any], kids: list[dict[str, Any]]) -> dict[str, Any]:
    """A turn's history with its children and its usage, theirs added."""
    own = usage_of(history["model_calls"])
    return {**history, "children": kids, "usage": added(own, *(c["usage"] for c in kids))}
