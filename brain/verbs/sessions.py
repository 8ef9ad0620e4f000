"""What users ask the Brain to do, over its store: one place for the CLI (and the HTTP API).

Each verb is idempotent where it takes a request id: the same request id with the same input
answers what the first call did, however many race; with other input it raises ConflictError.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from functools import partial
from typing import Any

from brain.rules.agents import AgentDefinition
from brain.rules.doubletext import SUPERSEDING, Strategy, strategy_of
from brain.rules.metadata import check_metadata
from brain.rules.names import MAX_REQUEST_ID, MAX_SESSION_ID, check_id, check_thread_name
from brain.rules.submits import MAIN_THREAD, Submit, session_key, shown_session, thread_id
from brain.store import BrainStore, Control
from brain.store.metadata import SESSION, THREAD
from brain.verbs import delegations
from brain.verbs.doubletext import submit_superseding
from brain.verbs.tools import KnownTools
from brain.verbs.turn_history import turn_history
from infra.db import Connection
from infra.transport import Topology
from protocol import NotFoundError, SchemaError
from protocol.storable import unstorable


async def submit(
    store: BrainStore,
    *,
    namespace: str,
    session_id: str,
    request_id: str,
    user_input: str,
    agent: AgentDefinition,
    wake_channel: str,
    thread: str = MAIN_THREAD,
    served: Callable[[Submit], Awaitable[tuple[str, bool]]] | None = None,
    follow_edits: Callable[[str], None] | None = None,
    expect_tools: bool = False,
    tools: KnownTools | None = None,
    metadata: Mapping[str, str] | None = None,
    thread_metadata: Mapping[str, str] | None = None,
    strategy: Strategy | str = Strategy.ENQUEUE,
    topology: Topology | None = None,
    ended: Callable[[str, str, datetime], None] | None = None,
    send: Callable[[list[Control]], object] | None = None,
) -> tuple[str, bool]:
    """Accept a turn durably (invariant 1) on ``thread`` of the session (created on first use,
    pinned to ``agent``'s version); returns (turn id, created by this call). ``served``: a Brain's
    own submit, which may start the turn's run in the same commit (``brain.run.claims.Served``).

    Racing submits of one request id all get the one turn (the loser tries again and finds it).
    Text the database cannot store (a NUL) is bad input, said so before anything is written.
    ``follow_edits`` (a local development server): the agent's version is taken from its content,
    and a thread pinned to another version of it, with nothing unfinished, moves to this one (and
    is told to it) instead of refusing the submit: an edited agent file needs no new version.
    An agent whose model kind no Brain has, or that names a tool no Hands pool has announced, is
    refused (``KnownTools.admit``; ``tools``: what this process knows of them already), unless
    ``expect_tools`` (or the agent's own ``expect_tools``) says a pool will announce it later.
    ``metadata``, ``thread_metadata``: set on the session and thread just after the turn's commit
    (a submit without them writes nothing more; a repeated one sets them again). ``strategy``:
    what to do when the thread has an unfinished turn (``brain.rules.doubletext``); interrupt and
    rollback cancel those, with ``topology`` (``ended``, ``send`` as for ``controls.control``).
    """
    _check(session_id, request_id, thread, user_input, agent)
    chose = strategy_of(strategy)
    pairs = check_metadata(metadata), check_metadata(thread_metadata, "thread_metadata")
    await (tools or KnownTools()).admit(store, agent, expect=expect_tools)
    if follow_edits is not None:
        agent = agent.versioned_by_content()
        chosen, edited = thread_id(session_key(namespace, session_id), thread), agent
        if await store.transact(lambda conn: store.sessions.repin_thread(conn, namespace, chosen, edited)):
            follow_edits(chosen)
    submit = Submit(
        namespace, session_id, request_id, user_input, agent, wake_channel, thread, strategy=chose
    )
    if chose in SUPERSEDING:
        done = await submit_superseding(store, submit, topology=topology, ended=ended, send=send)
    else:
        done = await (served or store.submits.submit)(submit)
    if any(pairs):
        await store.transact(partial(_describe, store, submit, *pairs))
    return done


def _check(session_id: str, request_id: str, thread: str, user_input: str, agent: AgentDefinition) -> None:
    """SchemaError for a submit's id or text that no store should keep."""
    check_id("session id", session_id, MAX_SESSION_ID)
    check_id("request id", request_id, MAX_REQUEST_ID)
    check_thread_name(thread)
    for what, problem in (("the input", unstorable(user_input)), (f"agent {agent.name}", agent.unstorable)):
        if problem is not None:
            raise SchemaError(f"{what} cannot be stored: its text {problem}")


async def _describe(
    store: BrainStore, submit: Submit, session: Mapping[str, str], thread: Mapping[str, str], conn: Connection
) -> None:
    """Set a submit's metadata on its session and thread."""
    await store.metadata.set(conn, SESSION, submit.session_key, session)
    await store.metadata.set(conn, THREAD, submit.thread_id, thread)


async def _session(store: BrainStore, conn: Connection, namespace: str, session_id: str) -> str:
    """The store's key of ``namespace``'s session ``session_id`` (``session_key``); NotFoundError
    when it has none (another namespace's session of that id is not there)."""
    key = session_key(namespace, session_id)
    if await store.sessions.session(conn, namespace, key) is None:
        raise NotFoundError(f"there is no session {session_id!r}")
    return key


def shown_turn(namespace: str, row: Any) -> dict[str, Any]:
    """A turn of a list (``Sessions.turns_of``) with its session's and thread's ids as its
    namespace gave them."""
    return {
        **dict(row),
        "session_id": shown_session(namespace, row["session_id"]),
        "thread_id": shown_session(namespace, row["thread_id"]),
    }


async def threads(store: BrainStore, *, namespace: str, session_id: str) -> list[dict[str, Any]]:
    """A session's threads: each one's agent version, state and turns."""

    async def read(conn: Connection) -> list[Any]:
        return await store.sessions.threads_of(conn, await _session(store, conn, namespace, session_id))

    async def read_all(conn: Connection) -> tuple[list[Any], dict[str, dict[str, str]]]:
        rows = await read(conn)
        return rows, await store.metadata.of(conn, THREAD, [r["id"] for r in rows])

    rows, described = await store.read(read_all)
    return [shown_thread(namespace, r) | {"metadata": described.get(r["id"], {})} for r in rows]


def shown_thread(namespace: str, row: Any) -> dict[str, Any]:
    """A thread of a list (``Sessions.threads_of``) with its id, and the id of the thread it was
    forked from (its lineage, with ``forked_at``), as its namespace gave them."""
    parent = row["forked_from"]
    return {**dict(row), "id": shown_session(namespace, row["id"]),
            "forked_from": shown_session(namespace, parent) if parent else None}  # fmt: skip


async def turns(
    store: BrainStore,
    *,
    namespace: str,
    session_id: str,
    thread: str | None = None,
    status: str | None = None,
    limit: int = 50,
    after: int = 0,
) -> list[dict[str, Any]]:
    """A session's turns in accepted order, a page of ``limit`` after turn number ``after``, each
    with its agent and input."""
    if thread is not None:
        check_thread_name(thread)

    async def read(conn: Connection) -> list[dict[str, Any]]:
        key = await _session(store, conn, namespace, session_id)
        chosen = thread_id(key, thread) if thread is not None else None
        rows = await store.sessions.turns_of(conn, key, chosen, status, limit, after)
        inputs = await store.sessions.inputs(conn, key, [r["id"] for r in rows])
        return [{**shown_turn(namespace, r), "input": inputs.get(r["id"])} for r in rows]

    return await store.read(read)


async def history(store: BrainStore, *, namespace: str, turn_id: str) -> dict[str, Any]:
    """A turn's runs, steps and model calls, read from its journal; its delegated children, and its
    usage with theirs (``brain.verbs.delegations``)."""

    async def read(conn: Connection) -> tuple[list[Any], list[dict[str, Any]]]:
        turn = await store.turns.lock_turn(conn, namespace, turn_id, lock=False)
        if turn is None:
            raise NotFoundError(f"there is no turn {turn_id!r}")
        entries = await store.journal.entries(conn, turn.session_id, turn_id=turn_id, limit=100_000)
        return entries, await delegations.children(store, conn, turn.session_id, turn_id)

    entries, kids = await store.read(read)
    return delegations.rolled_up(turn_history(entries), kids)


async def close(store: BrainStore, *, namespace: str, session_id: str, thread: str | None = None) -> bool:
    """Close a thread of a session (or, without ``thread``, the whole session): it takes no more
    turns. Refused while a turn in it is unfinished. True when this call closed it, False when it
    was closed already (closing is idempotent)."""
    if thread is not None:
        check_thread_name(thread)

    async def work(conn: Connection) -> bool:
        key = await _session(store, conn, namespace, session_id)
        if thread is None:
            return await store.sessions.close_session(conn, key, f"session {session_id!r}")
        what = f"thread {thread!r} of session {session_id!r}"
        return await store.sessions.close_thread(conn, thread_id(key, thread), what)

    return await store.transact(work)
