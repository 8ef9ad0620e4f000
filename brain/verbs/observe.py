"""Observing a session without changing it (invariant 13): its journal as events with cursors,
and a snapshot that says which cursor it is consistent with.

The cursor is the session's journal seq: an event is one journal entry (the facts of one commit),
its id its seq. ``events(cursor)`` gives those after it, so a follower that saved the last id it
saw resumes exactly there: every committed event once, in order (the session row orders its
entries by commit, so none commits behind a cursor that already passed it). A snapshot is read
in one consistent view together with the cursor it matches, so snapshot-then-follow neither
misses nor repeats an event. A cursor older than what retention keeps is refused
(:class:`~protocol.GoneError`: start again from a snapshot), never silently skipped.

One filter serves both: a thread, a turn (of that thread: a turn filter needs its thread), or a
run of a turn; a filter that names what is not the caller's is refused like an unknown id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from brain.rules.messages import messages
from brain.rules.submits import session_key, thread_name
from brain.rules.submits import thread_id as thread_key
from brain.store import BrainStore, Entry
from brain.verbs.sessions import check_thread_name, shown_thread, shown_turn
from infra.db import Connection
from protocol import GoneError, NotFoundError, SchemaError

MAX_PAGE = 1000


@dataclass(frozen=True)
class EventFilter:
    """What part of a session to observe (all of it by default)."""

    thread: str | None = None
    turn: str | None = None
    run: int | None = None

    def check(self) -> None:
        if self.thread is not None:
            check_thread_name(self.thread)
        if self.turn is not None and self.thread is None:
            raise SchemaError("a turn filter needs its thread (thread=main for a session's first thread)")
        if self.run is not None and self.turn is None:
            raise SchemaError("a run filter needs its turn")


@dataclass(frozen=True)
class Scope:
    """A filter resolved against the store: the ids it stands for (the session's: its key)."""

    session_id: str
    thread_id: str | None
    turn_id: str | None
    run: int | None


async def _scope(
    store: BrainStore, conn: Connection, namespace: str, session_id: str, f: EventFilter
) -> Scope:
    f.check()
    key = session_key(namespace, session_id)
    if await store.sessions.session(conn, namespace, key) is None:
        raise NotFoundError(f"there is no session {session_id!r}")
    thread_id = thread_key(key, f.thread) if f.thread is not None else None
    if f.turn is not None:
        turn = await store.turns.lock_turn(conn, namespace, f.turn, lock=False)
        if turn is None or turn.session_id != key or turn.thread_id != thread_id:
            raise NotFoundError(
                f"there is no turn {f.turn!r} in thread {f.thread!r} of session {session_id!r}"
            )
    return Scope(key, thread_id, f.turn, f.run)


def event(entry: Entry, session_id: str) -> dict[str, Any]:
    """One journal entry as observers see it (of ``session_id``, as its namespace calls it)."""
    return {
        "seq": entry.seq,
        "session_id": session_id,
        "thread": thread_name(entry.session_id, entry.thread_id or entry.session_id),
        "turn_id": entry.turn_id,
        "run": entry.run,
        "status": entry.status,
        "phase": entry.phase,
        "facts": entry.facts,
        "at": entry.created_at.isoformat() if entry.created_at is not None else None,
    }


@dataclass(frozen=True)
class Page:
    """Events after a cursor, and the cursor to ask from next (past every entry looked at, the
    ones the filter left out included)."""

    events: list[dict[str, Any]]
    cursor: int

    def as_dict(self) -> dict[str, Any]:
        return {"events": self.events, "cursor": self.cursor}


async def check_cursor(
    store: BrainStore, conn: Connection, scope: Scope, session_id: str, cursor: int
) -> None:
    """GoneError when events after ``cursor`` were trimmed already."""
    first = await store.journal.first_seq(conn, scope.session_id)
    if cursor < first - 1:
        raise GoneError(
            f"cursor {cursor} of session {session_id!r} is older than what is kept (from {first}): "
            "take a snapshot and follow from its cursor"
        )


async def list_events(
    store: BrainStore,
    *,
    namespace: str,
    session_id: str,
    cursor: int = 0,
    limit: int = 100,
    where: EventFilter = EventFilter(),
) -> Page:
    """The events of a session after ``cursor`` (at most ``limit``), as ``where`` narrows them."""
    if cursor < 0 or not 1 <= limit <= MAX_PAGE:
        raise SchemaError(f"cursor must be 0 or more and limit 1 to {MAX_PAGE}")

    async def read(conn: Connection) -> Page:
        scope = await _scope(store, conn, namespace, session_id, where)
        await check_cursor(store, conn, scope, session_id, cursor)
        last = await store.journal.last_seq(conn, scope.session_id)
        entries = await store.journal.events(
            conn, scope.session_id, after=cursor, limit=limit, thread_id=scope.thread_id,
            turn_id=scope.turn_id, run=scope.run,
        )  # fmt: skip
        # A full page ends at its last event; a shorter one has looked at everything up to ``last``.
        next_cursor = entries[-1].seq if len(entries) == limit else max(cursor, last)
        return Page([event(e, session_id) for e in entries], next_cursor)

    return await store.read_consistent(read)


# What the snapshot says of each execution: enough to show it, and where to read its output on from.
SNAPSHOT_EXECUTION = ("id", "call_id", "tool", "status", "how", "result", "error", "output_bytes")


async def snapshot(
    store: BrainStore, *, namespace: str, session_id: str, where: EventFilter = EventFilter()
) -> dict[str, Any]:
    """Where the session (or the part ``where`` names) stands, and the cursor it is consistent
    with: follow the events from there and nothing is missed or seen twice."""

    async def read(conn: Connection) -> dict[str, Any]:
        scope = await _scope(store, conn, namespace, session_id, where)
        cursor = await store.journal.last_seq(conn, scope.session_id)
        turns = await store.sessions.turns_of(conn, scope.session_id, scope.thread_id, None, MAX_PAGE, 0)
        if scope.turn_id is not None:
            turns = [t for t in turns if t["id"] == scope.turn_id]
        executions = {}
        for t in turns:
            executions[t["id"]] = [
                {
                    k: e[k]
                    for k in ("id", "call_id", "tool", "status", "how", "result", "error", "output_bytes")
                }
                for e in await store.executions.turn_executions(conn, t["id"])
            ]
        threads = await store.sessions.threads_of(conn, scope.session_id)
        entries = await store.journal.events(
            conn, scope.session_id, after=0, limit=100_000, thread_id=scope.thread_id, turn_id=scope.turn_id
        )
        said = messages(entries)  # each turn's assistant messages, with their attempts
        return {
            "cursor": cursor,
            "session_id": session_id,
            "threads": [shown_thread(namespace, t) for t in threads if scope.thread_id in (None, t["id"])],
            "turns": [
                shown_turn(namespace, t)
                | {"executions": executions[t["id"]], "messages": said.get(t["id"], [])}
                for t in turns
            ],
        }

    return await store.read_consistent(read)
