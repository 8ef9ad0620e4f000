"""What the CLI shows of a turn: one read of everything about it, and its human rendering."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from brain.rules.batches import NAME as BATCH
from brain.rules.batches import child_call
from brain.rules.history import ThreadHistory
from brain.rules.submits import shown_session, thread_name
from brain.store import BrainStore, Entry
from protocol import NotFoundError

# What a description shows of each execution, as its row has it (``VIEW_EXECUTION_COLUMNS``).
SHOWN = (
    "id", "call_id", "tool", "route", "status", "attempts", "how", "evidence", "result", "error", "last_seq",
    "tool_step", "worker", "output_bytes", "created_at", "updated_at",
)  # fmt: skip


def call_arguments(entries: Iterable[Entry]) -> dict[str, Any]:
    """Each tool call's arguments as the model made them, by call id (read from its replies in the
    journal: the execution's row keeps only its packed command)."""
    found: dict[str, Any] = {}
    for entry in entries:
        for fact in entry.facts:
            if fact.get("kind") == "turn.model_replied":
                for call in (fact.get("message") or {}).get("tool_calls") or []:
                    found[call.get("call_id")] = call.get("args")
                    if call.get("tool") == BATCH:  # its children's: its items (brain.rules.batches)
                        items = (call.get("args") or {}).get("items") or []
                        found |= {child_call(call.get("call_id"), i): item for i, item in enumerate(items)}
    return found


def turn_input(entries: Iterable[Entry]) -> str | None:
    """The user's input of the turn (its ``turn.accepted`` fact)."""
    for entry in entries:
        for fact in entry.facts:
            if fact.get("kind") == "turn.accepted":
                return (fact.get("input") or {}).get("text")  # type: ignore[no-any-return]
    return None


async def describe(store: BrainStore, namespace: str, turn_id: str) -> dict[str, Any]:
    """Everything `show` prints, as plain data: the turn's row, its executions (with the arguments
    the model gave each, and what a pending one awaits), and what its journal entries say (its
    input, its conversation, and how many runs it took)."""
    view = await store.read(lambda conn: store.views.turn_view(conn, namespace, turn_id))
    if view is None:
        raise NotFoundError(f"there is no turn {turn_id!r}")
    t, entries, exes = view.turn, view.entries, view.executions
    history = ThreadHistory()
    history.extend(entries, {e["id"]: e for e in exes}, t.thread_id)
    runs = sum(1 for entry in entries for fact in entry.facts if fact.get("kind") == "turn.run_started")
    args = call_arguments(entries)
    return {
        "turn_id": t.id,
        "session_id": shown_session(t.namespace, t.session_id),
        "thread": thread_name(t.session_id, t.thread_id),
        "revision": t.revision,
        "request_id": t.request_id,
        "status": str(t.status),
        "phase": str(t.phase),
        "waiting_for": t.waiting_for,
        "runs": runs,
        "created_at": t.created_at,
        "input": turn_input(entries),
        "result": t.result,
        "error": t.error,
        "history": [{"role": m.role, **m.content} for m in history.messages],
        "executions": [
            {
                **{k: e[k] for k in SHOWN},
                "args": args.get(e["call_id"]),
                # A pending call waits for a person: their approval, or a manual tool's result; a
                # running one may ask a person for input (an MCP task's), and says what.
                "awaits": (e["how"] or "").removeprefix("awaiting_")
                if e["status"] == "pending" or e["how"] == "awaiting_input"
                else None,
                "asks": e["input_request"] if e["how"] == "awaiting_input" else None,
            }
            for e in exes
        ],
    }
