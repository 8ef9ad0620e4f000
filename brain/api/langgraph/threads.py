"""LangGraph threads: a thread is a Tendon session, made before its first run (its runs go to the
session's main thread); its metadata is the session's (string pairs); deleting it closes the
session (refused while a run of it is unfinished), after which it is not found and its id is not
taken again. Its state and history are read from the journal (``state``); a copy is a fork of its
main thread into a new session (``brain.verbs.forks.copy``)."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request, Response

from brain import verbs
from brain.api.guard import CheckedRoute
from brain.api.langgraph import state as states
from brain.api.langgraph.bodies import HistoryBody, ThreadBody, ThreadSearch
from brain.api.langgraph.common import (
    CallerDep,
    NotSupported,
    api_of,
    body_of,
    matches,
    metadata_of,
    page,
    refuse,
    thread_key,
)
from brain.store import BrainStore
from brain.store.metadata import SESSION
from brain.verbs import forks
from infra.db import Connection
from protocol import ConflictError, NotFoundError, SchemaError

router = APIRouter(prefix="/langgraph", tags=["langgraph"], route_class=CheckedRoute)
STATUSES = ("idle", "busy", "interrupted", "error")


async def found(store: BrainStore, namespace: str, thread_id: str) -> states.Thread:
    key = thread_key(namespace, thread_id)
    t = await store.read(lambda conn: states.read_thread(store, conn, namespace, key))
    if t is None:
        raise NotFoundError(f"there is no thread {thread_id!r}")
    return t


async def make(
    store: BrainStore, namespace: str, thread_id: str, metadata: dict[str, str], if_exists: str
) -> None:
    """Make a thread (a session with no turn yet); ``if_exists``: ``raise`` (409) or ``do_nothing``."""
    key = thread_key(namespace, thread_id)

    async def work(conn: Connection) -> None:
        if not await store.sessions.add_session(conn, namespace, key):
            row = await store.sessions.session(conn, namespace, key)
            if row is None:  # pragma: no cover - a session key holds its namespace
                raise ConflictError(f"thread {thread_id!r} is taken")
            if row["closed_at"] is not None:
                raise ConflictError(f"thread {thread_id!r} was deleted: Tendon does not take its id again")
            if if_exists != "do_nothing":
                raise ConflictError(f"thread {thread_id!r} exists (if_exists=do_nothing takes it)")
            return
        await store.metadata.set(conn, SESSION, key, metadata)

    await store.transact(work, read_then_insert=True)


@router.post("/threads")
async def create(request: Request, caller: CallerDep) -> dict[str, Any]:
    body, store, namespace = await body_of(request, ThreadBody), api_of(request).store, caller.tenant()
    refuse(
        body, {"supersteps": "a thread's state is its journal: start it with a run", "ttl": "not built yet"}
    )
    thread_id = body.get("thread_id") or str(uuid.uuid4())
    if not isinstance(thread_id, str):
        raise SchemaError("thread_id must be a string")
    if body.get("if_exists", "raise") not in ("raise", "do_nothing"):
        raise SchemaError("if_exists is raise or do_nothing")
    await make(store, namespace, thread_id, metadata_of(body.get("metadata")), body.get("if_exists", "raise"))
    return states.shown(namespace, await found(store, namespace, thread_id))


@router.get("/threads/{thread_id}")
async def get(thread_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    namespace = caller.tenant()
    return states.shown(namespace, await found(api_of(request).store, namespace, thread_id))


@router.patch("/threads/{thread_id}")
async def update(thread_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """Set metadata pairs (keys not given stay)."""
    body, store, namespace = await body_of(request, ThreadBody), api_of(request).store, caller.tenant()
    refuse(body, {"ttl": "not built yet"})
    pairs = metadata_of(body.get("metadata"))
    await found(store, namespace, thread_id)
    key = thread_key(namespace, thread_id)
    await store.transact(lambda conn: store.metadata.set(conn, SESSION, key, pairs))
    return states.shown(namespace, await found(store, namespace, thread_id))


@router.delete("/threads/{thread_id}", status_code=204)
async def delete(thread_id: str, request: Request, caller: CallerDep) -> Response:
    store, namespace = api_of(request).store, caller.tenant()
    await found(store, namespace, thread_id)
    await verbs.close(store, namespace=namespace, session_id=thread_id)
    return Response(status_code=204)


async def _searched(request: Request, caller: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    body, store, namespace = await body_of(request, ThreadSearch), api_of(request).store, caller.tenant()
    refuse(body, {"values": "search by metadata or status", "extract": "not built yet"})
    if body.get("status") not in (None, *STATUSES):
        raise SchemaError(f"status is one of {', '.join(STATUSES)}")
    ids = body.get("ids")
    rows = await store.read(
        lambda conn: store.sessions.sessions_of(conn, namespace, search=None, limit=10_000, before=None)
    )
    keys = [r["id"] for r in rows if r["closed_at"] is None]
    if ids is not None:
        wanted = {thread_key(namespace, str(i)) for i in ids}
        keys = [k for k in keys if k in wanted]

    async def work(conn: Connection) -> list[states.Thread]:
        read = [await states.read_thread(store, conn, namespace, k, whole=False) for k in keys]
        return [t for t in read if t is not None]

    # What the filters need only (no journal): the page found is then read whole
    threads = [states.shown(namespace, t, values=False) for t in await store.read(work)]
    threads = [t for t in threads if matches(t["metadata"], body.get("metadata"))]
    threads = [t for t in threads if body.get("status") in (None, t["status"])]
    return threads, body


@router.post("/threads/search")
async def search(request: Request, caller: CallerDep) -> list[dict[str, Any]]:
    threads, body = await _searched(request, caller)
    sort_by = body.get("sort_by") or "created_at"
    threads.sort(key=lambda t: str(t.get(sort_by)), reverse=body.get("sort_order", "desc") == "desc")
    store, namespace = api_of(request).store, caller.tenant()
    return [
        states.shown(namespace, await found(store, namespace, t["thread_id"])) for t in page(threads, body)
    ]


@router.post("/threads/count")
async def count(request: Request, caller: CallerDep) -> int:
    threads, _ = await _searched(request, caller)
    return len(threads)


@router.get("/threads/{thread_id}/state")
async def get_state(thread_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    t = await found(api_of(request).store, caller.tenant(), thread_id)
    return states.state(thread_id, t)


@router.get("/threads/{thread_id}/state/{checkpoint_id}")
async def state_at(thread_id: str, checkpoint_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """The state at one of the thread's checkpoints (a journal seq of its history)."""
    t = await found(api_of(request).store, caller.tenant(), thread_id)
    for said in states.history(thread_id, t):
        if said["checkpoint"]["checkpoint_id"] == checkpoint_id:
            return said
    raise NotFoundError(f"thread {thread_id!r} has no checkpoint {checkpoint_id!r}")


@router.post("/threads/{thread_id}/state")
async def update_state(thread_id: str, caller: CallerDep) -> None:
    raise NotSupported(
        "update_state: a Tendon thread's state is its journal of committed turns; "
        "a new message is a run (or a steer or inject on a running turn, /v1/turns/{id}/controls)"
    )


@router.post("/threads/{thread_id}/state/checkpoint")
async def state_by_checkpoint(thread_id: str, caller: CallerDep) -> None:
    raise NotSupported("a state by checkpoint object: ask GET /threads/{id}/state/{checkpoint_id}")


@router.post("/threads/{thread_id}/history")
async def history(thread_id: str, request: Request, caller: CallerDep) -> list[dict[str, Any]]:
    """The thread's checkpoints, newest first: ``limit`` of them, those before ``before``."""
    body = await body_of(request, HistoryBody)
    refuse(body, {"checkpoint": "ask with before={checkpoint_id}"})
    t = await found(api_of(request).store, caller.tenant(), thread_id)
    said = states.history(thread_id, t)
    before = (body.get("before") or {}).get("checkpoint_id") if isinstance(body.get("before"), dict) else None
    if before is not None:
        if not str(before).isdigit():
            raise SchemaError("before.checkpoint_id is a checkpoint id of this thread (a journal seq)")
        said = [s for s in said if int(s["checkpoint"]["checkpoint_id"]) < int(before)]
    said = [s for s in said if matches(s["metadata"], body.get("metadata"))]
    return said[: max(1, min(int(body.get("limit", 10)), 1000))]


@router.post("/threads/{thread_id}/copy")
async def copy(thread_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """A new thread (a new id) whose conversation is this one's as it stands, snapped back to where
    every tool call had its result (``brain.verbs.forks.copy``): its results are the recorded ones,
    so a run on the copy never runs those tools again, and no approval waits in it."""
    store, namespace = api_of(request).store, caller.tenant()
    await found(store, namespace, thread_id)
    made = await forks.copy(store, namespace, thread_id, str(uuid.uuid4()))
    return states.shown(namespace, await found(store, namespace, made["session_id"]))


@router.post("/threads/prune")
async def prune(caller: CallerDep) -> None:
    raise NotSupported("prune: delete threads one by one")
