"""A LangGraph thread as it stands, and its history, read from the session's journal: the thread
is the session, its state the conversation of its main thread. A checkpoint is a journal entry
that changed the conversation or ended a turn; its id is the entry's seq (checkpoints are not
kept beside the journal: invariant 16)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from brain.api.langgraph.common import when
from brain.api.langgraph.messages import ENDS, Conversation, call_args, interrupts
from brain.rules.history import needed_executions
from brain.rules.submits import shown_session
from brain.store import BrainStore, Entry
from brain.store.metadata import SESSION
from infra.db import Connection

MAX_ENTRIES = 100_000


@dataclass
class Thread:
    """What a thread's answers are made of, read in one view."""

    key: str
    row: Any  # the session's
    metadata: dict[str, str]
    counts: Any  # brain.store.langgraph.LangGraph.thread_state
    entries: list[Entry]
    executions: dict[str, Any]
    pending: list[Any]  # the executions of its unfinished turns that wait for a person

    @property
    def status(self) -> str:
        if self.counts["unfinished"]:
            return "interrupted" if self.counts["pending"] else "busy"
        return "error" if self.counts["last_status"] == "failed" else "idle"

    def conversation(self, upto: int | None = None) -> Conversation:
        convo = Conversation(self.key)
        for e in self.entries:
            if upto is None or e.seq <= upto:
                convo.add(e, self.executions)
        return convo

    def interrupts(self) -> list[dict[str, Any]]:
        return interrupts(self.pending, call_args(self.conversation().messages()))


async def read_thread(
    store: BrainStore, conn: Connection, namespace: str, key: str, *, whole: bool = True
) -> Thread | None:
    """The thread (session) of that key, unless it is not there or was deleted (closed); without
    ``whole``, only what a search filters by (its metadata and status), not its journal."""
    row = await store.sessions.session(conn, namespace, key)
    if row is None or row["closed_at"] is not None:
        return None
    metadata = (await store.metadata.of(conn, SESSION, [key])).get(key, {})
    counts = await store.langgraph.thread_state(conn, key)
    if not whole:
        return Thread(key, row, metadata, counts, [], {}, [])
    entries = await store.journal.entries(conn, key, after=0, limit=MAX_ENTRIES)
    needed = needed_executions(entries)
    executions = await store.executions.executions_by_id(conn, needed) if needed else {}
    pending: list[Any] = []
    if counts is not None and counts["pending"]:
        ended = {e.turn_id for e in entries for f in e.facts if f.get("kind") in ENDS}
        for turn_id in sorted({e.turn_id for e in entries if e.turn_id} - ended):
            rows = await store.executions.turn_executions(conn, turn_id)
            pending += [dict(r) for r in rows if r["status"] == "pending"]
    return Thread(key, row, metadata, counts, entries, executions, pending)


def shown(namespace: str, t: Thread, *, values: bool = True) -> dict[str, Any]:
    """A thread as LangGraph's clients read it."""
    updated = t.counts["updated_at"] or t.counts["created_at"]
    waiting = t.interrupts() if values else []
    return {
        "thread_id": shown_session(namespace, t.key),
        "created_at": when(t.counts["created_at"]),
        "updated_at": when(updated),
        "metadata": t.metadata,
        "status": t.status,
        "values": t.conversation().values() if values else {},
        "interrupts": {w["id"]: [w] for w in waiting},
    }


def checkpoint(thread_id: str, seq: int | None) -> dict[str, Any] | None:
    if seq is None:
        return None
    return {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": str(seq), "checkpoint_map": None}


def state(thread_id: str, t: Thread) -> dict[str, Any]:
    """The thread's state now (its latest checkpoint)."""
    checkpoints = history(thread_id, t)
    if checkpoints:
        return checkpoints[0]
    return {"values": {"messages": []}, "next": [], "checkpoint": checkpoint(thread_id, 0), "metadata": {},
            "created_at": None, "parent_checkpoint": None, "tasks": [], "interrupts": []}  # fmt: skip


def history(thread_id: str, t: Thread) -> list[dict[str, Any]]:
    """The thread's checkpoints, newest first; the newest says what waits for a person."""
    convo, parent = Conversation(t.key), None
    out: list[dict[str, Any]] = []
    for e in t.entries:
        new = convo.add(e, t.executions)
        ended = any(f.get("kind") in ENDS for f in e.facts)
        if not new and not ended:
            continue
        writes = {"model" if m["type"] == "ai" else "tools": {"messages": [m]} for m in new}
        meta = {
            "source": "loop",
            "step": e.seq,
            "run_id": e.turn_id,
            "thread_id": thread_id,
            "writes": writes,
        }
        out.append({"values": convo.values(), "next": [], "checkpoint": checkpoint(thread_id, e.seq),
                    "metadata": meta, "created_at": when(e.created_at), "parent_checkpoint": parent,
                    "tasks": [], "interrupts": []})  # fmt: skip
        parent = checkpoint(thread_id, e.seq)
    out.reverse()
    if out and t.pending:
        waiting = t.interrupts()
        tasks = [{"id": w["id"], "name": "tools", "error": None, "interrupts": [w], "checkpoint": None,
                  "state": None, "result": None} for w in waiting]  # fmt: skip
        out[0] = {**out[0], "next": ["tools"], "tasks": tasks, "interrupts": waiting}
    return out
