"""The tenant routes: sessions, threads, turns, controls, history, executions, events.

Every route acts in the caller's namespace: an id of another namespace is not found here.
"""

from __future__ import annotations

import asyncio
import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response

from brain import verbs
from brain.api.app import Api, caller_of
from brain.api.auth import Caller
from brain.api.guard import CheckedRoute
from brain.api.models import (
    INT32,
    INT64,
    JSON,
    ControlRequest,
    ErrorBody,
    EventPage,
    Receipt,
    RespondRequest,
    SignalRequest,
    SubmitRequest,
    Submitted,
    inlined,
    parsed,
)
from brain.rules.agents import AgentDefinition
from brain.rules.names import shown
from brain.rules.states import TERMINAL_TURN, TurnStatus
from brain.run.endings import wake_or_timeout
from brain.verbs import browse, controls, observe, signals
from brain.verbs.describe import describe
from protocol import SchemaError, new_id

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (401, 403, 404, 409, 410, 413, 422, 503)
}
router = APIRouter(prefix="/v1", responses=ERRORS, route_class=CheckedRoute)
CallerDep = Annotated[Caller, Depends(caller_of)]
MAX_WAIT = 60.0


def api_of(request: Request) -> Api:
    return request.app.state.api  # type: ignore[no-any-return]


def seconds(wait: str | None) -> float:
    """``30``, ``30s`` or ``1.5s`` as seconds (at most a minute)."""
    if wait is None:
        return 0.0
    found = re.fullmatch(r"\s*(\d{1,9}(?:\.\d{1,9})?)\s*s?\s*", wait, re.ASCII)
    if found is None:
        raise SchemaError(f"wait takes seconds (`30` or `30s`), not {shown(wait)}")
    return min(float(found.group(1)), MAX_WAIT)


# ---- sessions and threads ------------------------------------------------------------------


async def until_ended(api: Api, namespace: str, turn_id: str, wait: float, *, look: bool = True) -> None:
    """Return once the turn ended or ``wait`` seconds passed, whichever comes first (a wait never
    cancels a turn). A turn that ends in this Brain wakes the wait at once; one that ends
    elsewhere is seen at the next look at its row, every ``api.wait_poll`` seconds. ``look``:
    whether to look before the first wait (False for a turn this request has just created)."""
    loop, store = asyncio.get_running_loop(), api.store
    deadline = loop.time() + wait
    with api.endings.watch(turn_id) as ended:
        # Until then, only the turn's row is looked at (one read, not the three of a description).
        while not ended.is_set() and loop.time() < deadline:
            if look:
                row = await store.read(
                    lambda conn: store.turns.lock_turn(conn, namespace, turn_id, lock=False)
                )
                if row is None or row.status in TERMINAL_TURN:
                    return
            look = True
            await wake_or_timeout(ended, min(api.wait_poll, deadline - loop.time()))


# The submit starts every turn, so it is the API's hot path: it reads its own arguments from the
# request, where FastAPI's general machinery for them (the path, the query, the body, the
# caller's dependency, the answer's model) cost about 0.17 ms a request, the database work left
# out (416 against 246 us on a slow host, FastAPI 0.165; docs/benchmarks/NOTES.md, twenty-fourth round).
# Its OpenAPI entry says what a declared signature would have said (``SUBMIT_DOC``).
SUBMIT_DOC: dict[str, Any] = {
    "parameters": [
        {"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"}},
        {
            "name": "wait", "in": "query", "required": False, "example": "30s",
            "schema": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "description": "seconds to wait for the turn to end (`30` or `30s`, at most a minute)",
        },
    ],
    "requestBody": {"required": True, "content": {JSON: {"schema": inlined(SubmitRequest)}}},
}  # fmt: skip


@router.post(
    "/sessions/{session_id}/turns", response_model=Submitted, status_code=201, tags=["turns"],
    openapi_extra=SUBMIT_DOC, responses={
        200: {"model": Submitted, "description": "the request id's turn"},
        400: {"model": ErrorBody, "description": "`unknown_tool`: a tool no Hands pool announced"},
    },
)  # fmt: skip
async def submit(request: Request) -> Response:
    """Accept a turn durably: answered once it is committed. With ``wait``, answered once the turn
    ended or that long passed, with the turn as it stands in ``turn``: a client that wants the
    result makes one request, not two (the turn is accepted either way; a wait never cancels it)."""
    caller = await caller_of(request)
    wait = request.query_params.get("wait")
    limit = seconds(wait)  # a bad value is refused before anything is accepted
    body = parsed(SubmitRequest, await request.json())  # strict JSON: brain.api.guard
    api, namespace = api_of(request), caller.tenant()
    turn_id, created = await verbs.submit(
        api.store, namespace=namespace, session_id=request.path_params["session_id"],
        request_id=body.request_id, user_input=body.input, agent=body.agent, wake_channel=api.wake_channel,
        thread=body.thread, served=api.served, follow_edits=api.edits, expect_tools=body.expect_tools,
        metadata=body.metadata, thread_metadata=body.thread_metadata,
        tools=api.tools, strategy=body.multitask_strategy, topology=api.topology, ended=api.ended,
        send=api.controls,
    )  # fmt: skip
    answer = Submitted(turn_id=turn_id, created=created)
    if created and body.agent.tools:
        answer.warnings = await unserved(api, body.agent)
    if wait is not None:
        # A turn made just now has not ended (its run, if here, starts once this yields): no look
        # first. A known request's turn may have ended long ago: looked at first.
        await until_ended(api, namespace, turn_id, limit, look=not created)
        answer.turn = await describe(api.store, namespace, turn_id)
    return Response(
        answer.model_dump_json(exclude_none=True), status_code=201 if created else 200, media_type=JSON
    )


async def unserved(api: Api, agent: AgentDefinition) -> list[str] | None:
    """Why some of a submitted agent's tools would not run now (None: all would, or this Brain
    cannot tell). Only a hint: the turn is accepted already, whatever the broker answers."""
    if api.transport is None:
        return None
    try:
        return await api.tools.unserved(api.store, api.transport, api.topology, agent) or None
    except Exception as exc:  # noqa: BLE001 - the submit committed: it is answered as accepted
        return [f"could not check which tools are served: {type(exc).__name__}"]


@router.get("/sessions", tags=["sessions"])
async def sessions(
    request: Request,
    caller: CallerDep,
    search: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 20,
    after: Annotated[str | None, Query(max_length=400)] = None,
) -> dict[str, Any]:
    """The caller's sessions, newest first, each with its counts and its latest turn (status,
    agent, input, times): a page of ``limit``, the next one from ``after=`` its ``next``.
    ``search`` keeps the sessions whose id, an agent's name or a turn's request id holds it."""
    return await browse.sessions(
        api_of(request).store, namespace=caller.tenant(), search=search, limit=limit, after=after
    )


@router.get("/sessions/{session_id}/threads", tags=["sessions"])
async def threads(session_id: str, request: Request, caller: CallerDep) -> list[dict[str, Any]]:
    return await verbs.threads(api_of(request).store, namespace=caller.tenant(), session_id=session_id)


@router.get("/sessions/{session_id}/turns", tags=["turns"])
async def turns(
    session_id: str,
    request: Request,
    caller: CallerDep,
    thread: str | None = None,
    status: TurnStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    after: Annotated[int, Query(ge=0, le=INT64)] = 0,
) -> list[dict[str, Any]]:
    """A session's turns in accepted order, a page of ``limit`` after turn number ``after``."""
    return await verbs.turns(
        api_of(request).store, namespace=caller.tenant(), session_id=session_id, thread=thread,
        status=str(status) if status else None, limit=limit, after=after,
    )  # fmt: skip


@router.post("/sessions/{session_id}/close", tags=["sessions"])
async def close(
    session_id: str, request: Request, caller: CallerDep, thread: str | None = None
) -> dict[str, Any]:
    """Close a session (or one thread of it): refused while a turn in it is unfinished."""
    closed = await verbs.close(
        api_of(request).store, namespace=caller.tenant(), session_id=session_id, thread=thread
    )
    return {"closed": closed}


# ---- turns ---------------------------------------------------------------------------------


@router.get("/turns/{turn_id}", tags=["turns"])
async def turn(
    turn_id: str,
    request: Request,
    caller: CallerDep,
    wait: Annotated[str | None, Query(examples=["30s"])] = None,
) -> dict[str, Any]:
    """A turn as it stands: with ``wait``, once it ended or that long passed (a wait never
    cancels it). A turn that ends in this Brain answers at once."""
    api, namespace = api_of(request), caller.tenant()
    await until_ended(api, namespace, turn_id, seconds(wait))
    return await describe(api.store, namespace, turn_id)


@router.get("/turns/{turn_id}/history", tags=["turns"])
async def history(turn_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """Runs, steps and model calls (attempt, latency, usage, LOST)."""
    return await verbs.history(api_of(request).store, namespace=caller.tenant(), turn_id=turn_id)


@router.get("/turns/{turn_id}/executions", tags=["turns"])
async def executions(turn_id: str, request: Request, caller: CallerDep) -> list[dict[str, Any]]:
    """The turn's tool executions (an UNKNOWN one waits for an operator's reconcile)."""
    found = await describe(api_of(request).store, caller.tenant(), turn_id)
    return found["executions"]  # type: ignore[no-any-return]


@router.get("/executions/{execution_id}/output", tags=["turns"])
async def output(
    execution_id: str,
    request: Request,
    caller: CallerDep,
    offset: Annotated[int, Query(ge=0, le=INT64)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> dict[str, Any]:
    """What a tool wrote as it ran, from byte ``offset`` on: its pages (each at its byte offset; a
    range that never arrived is a gap between two, never hidden), and the offset to ask from
    next. Pages come as the Brain applies them, before the tool ends."""
    return await browse.output(
        api_of(request).store, namespace=caller.tenant(), execution_id=execution_id, offset=offset,
        limit=limit,
    )  # fmt: skip


@router.get("/turns/{turn_id}/controls", response_model=list[Receipt], tags=["controls"])
async def receipts(turn_id: str, request: Request, caller: CallerDep) -> Any:
    found = await controls.receipts(api_of(request).store, namespace=caller.tenant(), turn_id=turn_id)
    return [r.as_dict() for r in found]


@router.post("/turns/{turn_id}/controls", response_model=Receipt, tags=["controls"])
async def control(turn_id: str, body: ControlRequest, request: Request, caller: CallerDep) -> Any:
    """steer, inject, withdraw, pause, resume or cancel: the receipt says where it stands."""
    api = api_of(request)
    receipt = await controls.control(
        api.store, namespace=caller.tenant(), turn_id=turn_id, request_id=body.request_id or new_id(),
        kind=controls.Kind(body.kind), topology=api.topology, wake_channel=api.wake_channel, text=body.text,
        revision=body.revision, target=body.control_id, ended=api.ended, send=api.controls,
    )  # fmt: skip
    return receipt.as_dict()


@router.post("/turns/{turn_id}/respond", response_model=Receipt, tags=["controls"])
async def respond(turn_id: str, body: RespondRequest, request: Request, caller: CallerDep) -> Any:
    """Approve or deny a call that waits for a person, give a manual tool's result, or answer
    what a running call asks for (an MCP task's input: ``result``, or ``deny`` to decline)."""
    api = api_of(request)
    receipt = await controls.respond(
        api.store, namespace=caller.tenant(), turn_id=turn_id, request_id=body.request_id or new_id(),
        call=body.call, decision=body.decision, result=body.result, reason=body.reason,
        wake_channel=api.wake_channel, topology=api.topology,
    )  # fmt: skip
    return receipt.as_dict()


@router.post("/turns/{turn_id}/signals", response_model=Receipt, tags=["controls"])
async def signal(turn_id: str, body: SignalRequest, request: Request, caller: CallerDep) -> Any:
    """Send a signal to the turn's call that waits for its key (the built-in ``wait_for_signal``);
    rejected, saying so, when none waits for it now. Idempotent by ``request_id``."""
    api = api_of(request)
    receipt = await signals.signal(
        api.store, namespace=caller.tenant(), turn_id=turn_id, request_id=body.request_id or new_id(),
        key=body.key, payload=body.payload, wake_channel=api.wake_channel,
    )  # fmt: skip
    return receipt.as_dict()


# ---- events --------------------------------------------------------------------------------


async def event_filter(  # async: see caller_of
    thread: str | None = None,
    turn: str | None = None,
    run: Annotated[int | None, Query(ge=1, le=INT32)] = None,
) -> observe.EventFilter:
    return observe.EventFilter(thread=thread, turn=turn, run=run)


FilterDep = Annotated[observe.EventFilter, Depends(event_filter)]


@router.get("/sessions/{session_id}/events", response_model=EventPage, tags=["events"])
async def events(
    session_id: str,
    request: Request,
    caller: CallerDep,
    where: FilterDep,
    cursor: Annotated[int, Query(ge=0, le=INT64)] = 0,
    limit: Annotated[int, Query(ge=1, le=observe.MAX_PAGE)] = 100,
) -> Any:
    """The session's events after ``cursor`` (each a journal entry, its id its seq); a cursor
    older than what is kept answers 410."""
    page = await observe.list_events(
        api_of(request).store, namespace=caller.tenant(), session_id=session_id, cursor=cursor, limit=limit,
        where=where,
    )  # fmt: skip
    return page.as_dict()


@router.get("/sessions/{session_id}/snapshot", tags=["events"])
async def snapshot(session_id: str, request: Request, caller: CallerDep, where: FilterDep) -> dict[str, Any]:
    """Where the session stands, with the cursor to follow its events from."""
    return await observe.snapshot(
        api_of(request).store, namespace=caller.tenant(), session_id=session_id, where=where
    )
