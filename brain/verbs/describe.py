"""What the CLI shows of a turn: one read of everything about it, and its human rendering."""

from __future__ import annotations

from typing import Any

from brain.rules.history import ThreadHistory
from brain.store import BrainStore
from protocol import NotFoundError

RECONCILE_HINT = (
    "resolve each with `hands reconcile EXECUTION_ID --result JSON --evidence TEXT` "
    "(or --failed MESSAGE), or an operator's POST /v1/operator/executions/EXECUTION_ID/reconcile, "
    "once you know what happened"
)


async def describe(store: BrainStore, namespace: str, turn_id: str) -> dict[str, Any]:
    """Everything `show` prints, as plain data: the turn's row, its executions, and what its
    journal entries say (its conversation, and how many runs it took)."""
    view = await store.read(lambda conn: store.turn_view(conn, namespace, turn_id))
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


def print_turn(d: dict[str, Any]) -> None:
    """`show` and `wait` for people."""
    print(f"turn {d['turn_id']}  session {d['session_id']}  thread {d['thread']}  request {d['request_id']}")
    print(f"status: {d['status']} (phase {d['phase']}, revision {d['revision']}, {d['runs']} run(s))")
    if d["waiting_for"] and d["status"] in ("waiting", "paused"):
        print(f"waiting for: {d['waiting_for']}")
    if d["error"]:
        print(f"error: {d['error'].get('code')}: {d['error'].get('message')}")
    if d["executions"]:
        print("executions:")
        for e in d["executions"]:
            how = f" ({e['how']})" if e["how"] else ""
            print(f"  {e['call_id']:<8} {e['tool']:<16} {e['status']:<10}{how}  {e['id']}")
            if e["evidence"]:
                print(f"           evidence: {e['evidence']}")
            if e["status"] != "succeeded" and e["error"]:
                print(f"           {e['error'].get('code')}: {e['error'].get('message')}")
    if d["result"]:
        print("result:")
        print("  " + str(d["result"].get("text")).replace("\n", "\n  "))


def waiting_line(d: dict[str, Any]) -> str:
    """One line saying what a waiting turn waits for (and, for a reconcile, how to give it)."""
    line = f"turn {d['turn_id']} waits for {d['waiting_for'] or 'its tools'}"
    if (d["waiting_for"] or "").startswith("reconcile"):
        line += f"; {RECONCILE_HINT}"
    return line
