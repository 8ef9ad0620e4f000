"""What users ask the Brain to do, over its store: one place for the CLI (and the HTTP API).

Each verb is idempotent where it takes a request id: the same request id with the same input
answers what the first call did, however many race; with other input it raises ConflictError.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from brain.rules.agents import AgentDefinition
from brain.rules.names import MAX_REQUEST_ID, MAX_SESSION_ID, check_id, check_thread_name
from brain.rules.submits import MAIN_THREAD, Submit, thread_id
from brain.store import BrainStore
from brain.verbs.turn_history import turn_history
from infra.db import Connection
from infra.transport import Topology, Transport
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
) -> tuple[str, bool]:
    """Accept a turn durably (invariant 1) on ``thread`` of the session (created on first use,
    pinned to ``agent``'s version); returns (turn id, created by this call). ``served``: a Brain's
    own submit, which may start the turn's run in the same commit (``brain.run.claims.Served``).

    Racing submits of one request id all get the one turn: the one that lost the race to insert
    it is tried again, and then finds it. Text the database cannot store (a NUL) is bad input,
    said so before anything is written.

    ``follow_edits`` (a local development server): the agent's version is taken from its content,
    and a thread pinned to another version of it, with nothing unfinished, moves to this one (and
    is told to it) instead of refusing the submit: an edited agent file needs no new version.
    """
    check_id("session id", session_id, MAX_SESSION_ID)
    check_id("request id", request_id, MAX_REQUEST_ID)
    check_thread_name(thread)
    for what, problem in (("the input", unstorable(user_input)), (f"agent {agent.name}", agent.unstorable)):
        if problem is not None:
            raise SchemaError(f"{what} cannot be stored: its text {problem}")
    if follow_edits is not None:
        agent = agent.versioned_by_content()
        chosen, edited = thread_id(session_id, thread), agent
        if await store.transact(lambda conn: store.sessions.repin_thread(conn, namespace, chosen, edited)):
            follow_edits(chosen)
    submit = Submit(namespace, session_id, request_id, user_input, agent, wake_channel, thread)
    return await (served or store.submits.submit)(submit)


async def _session(store: BrainStore, conn: Connection, namespace: str, session_id: str) -> Any:
    found = await store.sessions.session(conn, namespace, session_id)
    if found is None:
        raise NotFoundError(f"there is no session {session_id!r}")
    return found


async def threads(store: BrainStore, *, namespace: str, session_id: str) -> list[dict[str, Any]]:
    """A session's threads: each one's agent version, state and turns."""

    async def read(conn: Connection) -> list[Any]:
        await _session(store, conn, namespace, session_id)
        return await store.sessions.threads_of(conn, session_id)

    return [dict(r) for r in await store.read(read)]


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
        await _session(store, conn, namespace, session_id)
        chosen = thread_id(session_id, thread) if thread is not None else None
        rows = await store.sessions.turns_of(conn, session_id, chosen, status, limit, after)
        inputs = await store.sessions.inputs(conn, session_id, [r["id"] for r in rows])
        return [{**dict(r), "input": inputs.get(r["id"])} for r in rows]

    return await store.read(read)


async def history(store: BrainStore, *, namespace: str, turn_id: str) -> dict[str, Any]:
    """A turn's runs, steps and model calls, read from its journal."""

    async def read(conn: Connection) -> list[Any]:
        turn = await store.turns.lock_turn(conn, namespace, turn_id, lock=False)
        if turn is None:
            raise NotFoundError(f"there is no turn {turn_id!r}")
        return await store.journal.entries(conn, turn.session_id, turn_id=turn_id, limit=100_000)

    return turn_history(await store.read(read))


async def close(store: BrainStore, *, namespace: str, session_id: str, thread: str | None = None) -> bool:
    """Close a thread of a session (or, without ``thread``, the whole session): it takes no more
    turns. Refused while a turn in it is unfinished. True when this call closed it, False when it
    was closed already (closing is idempotent)."""
    if thread is not None:
        check_thread_name(thread)

    async def work(conn: Connection) -> bool:
        await _session(store, conn, namespace, session_id)
        if thread is None:
            return await store.sessions.close_session(conn, session_id)
        what = f"thread {thread!r} of session {session_id!r}"
        return await store.sessions.close_thread(conn, thread_id(session_id, thread), what)

    return await store.transact(work)


async def unserved_tools(
    store: BrainStore, transport: Transport, topology: Topology, tools: list[str]
) -> list[str]:
    """Why some of ``tools`` would not run now, one sentence each (none when all are served):
    never announced by any Hands pool, or announced for a route nobody consumes right now."""
    pairs = await store.bindings.bound_routes(tools)
    routes: dict[str, list[str]] = {}
    for name, route in pairs:
        routes.setdefault(route, []).append(name)
    problems = []
    missing = sorted(set(tools) - {name for name, _ in pairs})
    if missing:
        problems.append(f"no Hands pool has announced {', '.join(missing)}")
    for route, names in sorted(routes.items()):
        if await transport.consumers(topology.commands(route)) == 0:
            problems.append(f"no Hands pool serves route {route} ({', '.join(sorted(set(names)))}) right now")
    return problems
