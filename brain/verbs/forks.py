"""`fork` and `rewind`: a thread's conversation cut at a journal seq (``brain.rules.forks``).

A thread is named by its id as its namespace sees it: the session's id for a session's main
thread, ``session/name`` for another (``brain.rules.submits.thread_id``). A fork is a new thread of
the same session, pinned to the same agent version and frozen bindings, whose lineage (the thread
and the seq) its row keeps; submit to it by its name like to any thread. A rewind sets a thread
back in place and is refused while a turn of it is unfinished. Both are one transaction: the
thread row (a fork's) and the entry whose fact carries the conversation commit together.

A copy is a fork into a new session: its main thread starts with another session's main thread's
conversation (cut at that session's last seq, snapped back alike), pinned to the same agent version
and bindings, its lineage kept the same way; the session's metadata goes with it.
"""

from __future__ import annotations

from typing import Any

from brain.rules import facts
from brain.rules.forks import carried, cut
from brain.rules.history import needed_executions
from brain.rules.names import MAX_SESSION_ID, MAX_THREAD_NAME, check_id, check_thread_name
from brain.rules.submits import MAIN_THREAD, session_key, shown_session, thread_id, thread_name
from brain.store import BrainStore
from brain.store.metadata import SESSION
from infra.db import Connection, Row
from protocol import ConflictError, IllegalTransitionError, NotFoundError, SchemaError, new_id


async def fork(
    store: BrainStore, namespace: str, thread: str, at: int | None = None, *, name: str | None = None
) -> dict[str, Any]:
    """Fork ``thread`` at journal seq ``at`` (its session's last when None) into a new thread of
    its session named ``name`` (``fork-<id>`` when None). The same name, thread and seq again
    answer the fork made first (``created`` False); the name of another thread is a CONFLICT."""
    _check(thread, at)
    if name is not None:
        check_thread_name(name)
    chosen = name or f"fork-{new_id()[:12]}"

    async def work(conn: Connection) -> dict[str, Any]:
        parent = await _thread(store, conn, namespace, thread, lock=False)
        if parent["session_closed_at"] is not None:
            raise IllegalTransitionError(
                f"session {shown_session(namespace, parent['session_id'])!r} is closed"
            )
        upto = await _at(store, conn, parent, at)
        key = thread_id(parent["session_id"], chosen)
        known = await store.forks.thread(conn, namespace, key)
        if known is not None:
            if (known["forked_from"], known["forked_at"]) != (parent["id"], upto):
                raise ConflictError(f"thread {chosen!r} exists already, and is not this fork")
            first = await store.journal.events(conn, parent["session_id"], after=0, limit=1, thread_id=key)
            said = first[0].facts[0] if first and first[0].facts else {}
            done = (said.get("snapped_to", upto), len(said.get("messages", [])))
            return _said(namespace, key, parent, upto, done, created=False)
        snapped, messages = await _cut(store, conn, parent, upto)
        await store.forks.create(conn, parent, key, chosen, upto)
        fact = facts.forked(parent["name"], upto, snapped, carried(messages))
        await store.journal.append(conn, parent["session_id"], None, [fact], thread_id=key)
        return _said(namespace, key, parent, upto, (snapped, len(messages)), created=True)

    return await store.transact(work)


async def rewind(store: BrainStore, namespace: str, thread: str, at: int) -> dict[str, Any]:
    """Set ``thread``'s conversation back to what it was at journal seq ``at`` (snapped back to a
    boundary), in place: refused while a turn of it is unfinished, or once it is closed."""
    _check(thread, at)

    async def work(conn: Connection) -> dict[str, Any]:
        row = await _thread(store, conn, namespace, thread, lock=True)
        if row["closed_at"] is not None:
            raise IllegalTransitionError(f"thread {thread!r} is closed")
        busy = await store.forks.unfinished(conn, row["id"])
        if busy:
            raise IllegalTransitionError(
                f"thread {thread!r} has {busy} unfinished turn(s): rewind an idle thread (wait for them or "
                "cancel them first)"
            )
        upto = await _at(store, conn, row, at)
        snapped, messages = await _cut(store, conn, row, upto)
        fact = facts.rewound(upto, snapped, carried(messages))
        seq = await store.journal.append(conn, row["session_id"], None, [fact], thread_id=row["id"])
        return {"thread_id": thread, "at": upto, "snapped_to": snapped, "messages": len(messages), "seq": seq}

    return await store.transact(work)


async def copy(store: BrainStore, namespace: str, session_id: str, into: str) -> dict[str, Any]:
    """A new session ``into`` whose main thread starts as ``session_id``'s main thread stands now
    (a session with no turn yet is copied with its metadata only); ``into`` taken is a CONFLICT."""
    for said in (session_id, into):
        check_id("session id", said, MAX_SESSION_ID)
    source, key = session_key(namespace, session_id), session_key(namespace, into)

    async def work(conn: Connection) -> dict[str, Any]:
        row = await store.sessions.session(conn, namespace, source)
        if row is None:
            raise NotFoundError(f"there is no session {session_id!r}")
        if row["closed_at"] is not None:
            raise IllegalTransitionError(f"session {session_id!r} is closed")
        if not await store.sessions.add_session(conn, namespace, key):
            raise ConflictError(f"session {into!r} exists already")
        pairs = (await store.metadata.of(conn, SESSION, [source])).get(source, {})
        await store.metadata.set(conn, SESSION, key, pairs)
        done = {"session_id": into, "copied_from": session_id, "at": None, "snapped_to": None, "messages": 0}
        parent = await store.forks.thread(conn, namespace, source)  # its main thread's id is its key
        if parent is None:
            return done
        upto = await _at(store, conn, parent, None)
        snapped, messages = await _cut(store, conn, parent, upto)
        await store.forks.create(conn, parent, key, MAIN_THREAD, upto, session=key)
        fact = facts.forked(parent["name"], upto, snapped, carried(messages), from_session=session_id)
        await store.journal.append(conn, key, None, [fact], thread_id=key)
        return {**done, "at": upto, "snapped_to": snapped, "messages": len(messages)}

    return await store.transact(work, read_then_insert=True)


def _check(thread: str, at: int | None) -> None:
    check_id("thread id", thread, MAX_SESSION_ID + MAX_THREAD_NAME + 1)
    if at is not None and not 0 <= at < 2**63:
        raise SchemaError(f"at must be a journal seq (0 or more), not {at}")


async def _thread(store: BrainStore, conn: Connection, namespace: str, thread: str, *, lock: bool) -> Row:
    row = await store.forks.thread(conn, namespace, f"{namespace}/{thread}", lock=lock)
    if row is None:
        raise NotFoundError(f"there is no thread {thread!r}")
    return row


async def _at(store: BrainStore, conn: Connection, thread: Row, at: int | None) -> int:
    """``at``, checked against the session's journal (its last seq when None)."""
    last = await store.journal.last_seq(conn, thread["session_id"])
    if at is None:
        return last
    if at > last:
        raise SchemaError(f"at {at} is past the session's last journal entry ({last})")
    return at


async def _cut(store: BrainStore, conn: Connection, thread: Row, at: int) -> tuple[int, list[Any]]:
    entries = await store.forks.entries(conn, thread["session_id"], thread["id"], at)
    needed = needed_executions(entries)
    executions = await store.executions.executions_by_id(conn, needed) if needed else {}
    return cut(entries, executions, thread["id"], at)


def _said(
    namespace: str, key: str, parent: Row, at: int, made: tuple[int, int], *, created: bool
) -> dict[str, Any]:
    """What a fork answers: the new thread (``key``) and its lineage."""
    return {
        "thread_id": shown_session(namespace, key),
        "session_id": shown_session(namespace, parent["session_id"]),
        "thread": thread_name(parent["session_id"], key),
        "forked_from": shown_session(namespace, parent["id"]),
        "at": at,
        "snapped_to": made[0],
        "messages": made[1],
        "created": created,
    }
