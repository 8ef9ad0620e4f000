"""AG-UI over HTTP: a session's stream in AG-UI's events, and AG-UI's run endpoint.

- ``GET /v1/sessions/{id}/stream?format=ag-ui`` (``brain.api.stream``) follows the session as the
  native stream does, resumable with ``Last-Event-ID``, each event one AG-UI event (mapping in
  ``brain.api.agui_events``). An entry's events carry its seq as their id on the last one only: a
  reader cut off inside an entry gets that entry again, never loses part of it.
- ``POST /v1/agui/run`` takes AG-UI's ``RunAgentInput``: its ``threadId`` is the session, its
  ``runId`` the submit's request id (a repeated run request answers the same turn), its last user
  message the input, and ``forwardedProps.agent`` the agent definition (as a submit's ``agent``;
  ``forwardedProps.thread`` names another thread than ``main``). It submits the turn and streams
  it, from its start, until it ends or stops at calls that wait for a person (an AG-UI
  interrupt), under the thread and run ids the client sent. A run whose input answers those
  calls (a frontend tool's result as a ``tool`` message, or ``resume`` entries) sends each answer
  through ``respond`` and streams the same turn on from there (``brain.api.agui_input``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import nullcontext as nothing
from typing import Any

from ag_ui.core import RunStartedEvent, StateSnapshotEvent
from fastapi import APIRouter, Request
from sse_starlette.sse import EventSourceResponse

from brain import verbs
from brain.api.agui_events import OUTCOMES, AguiEvents, wire
from brain.api.agui_input import Asked, asked
from brain.api.app import Api
from brain.api.guard import CheckedRoute
from brain.api.routes import CallerDep, api_of
from brain.api.stream import previews_for
from brain.rules.langgraph import Answer, answers
from brain.rules.states import TERMINAL_TURN
from brain.rules.submits import session_key, thread_id
from brain.store.metadata import SESSION
from brain.verbs import controls, observe
from brain.verbs.describe import describe
from protocol import IllegalTransitionError, SchemaError, loads

router = APIRouter(prefix="/v1/agui", tags=["ag-ui"], route_class=CheckedRoute)
PAGE = 200


async def follow(
    request: Request, *, namespace: str, session_id: str, start: int, where: observe.EventFilter,
    pieces: asyncio.Queue[Any] | None, events: Any, until: str | None = None,
    metadata: Mapping[str, str] | None = None,
) -> AsyncIterator[dict[str, Any]]:  # fmt: skip
    """The session's entries from ``start`` (and previews, if ``pieces``) as AG-UI events; with
    ``until``, ends after that turn's end, or where it waits for a person (its state said first)."""
    api, position = api_of(request), start
    while not await request.is_disconnected():
        page = await observe.list_events(
            api.store, namespace=namespace, session_id=session_id, cursor=position, limit=PAGE, where=where
        )
        for e in page.events:
            said = events.entry(e, await _outcomes(api.store, e))
            ours = until is not None and e["turn_id"] == until
            ended = ours and e.get("status") in _ENDED
            waits = ours and not ended and any(f["kind"] == "execution.pending" for f in e["facts"])
            if ended:
                state = {"metadata": dict(metadata or {}), "waiting_for": []}
                said = [*said[:-1], StateSnapshotEvent(snapshot=state), said[-1]]
            elif waits:
                said += events.interrupted(e, metadata or {})
            for i, event in enumerate(said):
                yield {"data": wire(event), **({"id": str(e["seq"])} if i == len(said) - 1 else {})}
            if ended or waits:
                return
        position = page.cursor
        if len(page.events) == PAGE:
            continue
        async for piece in previews_for(pieces, api.poll):
            data = json.loads(piece["data"])
            if until is None or data.get("turn_id") == until:
                for event in events.preview(data):
                    yield {"data": wire(event)}


_ENDED = ("completed", "failed", "cancelled")
Filter = observe.EventFilter


def session_stream(
    request: Request,
    namespace: str,
    session_id: str,
    start: int,
    where: observe.EventFilter,
    *,
    previews: bool,
) -> EventSourceResponse:
    """``GET /v1/sessions/{id}/stream?format=ag-ui``: the native stream's checks were made."""
    api = api_of(request)

    async def stream() -> AsyncIterator[dict[str, Any]]:
        with api.previews.subscribe(session_key(namespace, session_id)) if previews else nothing() as pieces:
            async for item in follow(
                request, namespace=namespace, session_id=session_id, start=start, where=where, pieces=pieces,
                events=AguiEvents(),
            ):  # fmt: skip
                yield item

    return EventSourceResponse(stream(), ping=15, sep="\n")  # AG-UI clients split events on LF LF


async def _outcomes(store: Any, entry: Mapping[str, Any]) -> dict[str, Any]:
    """The executions whose outcome ``entry`` says, by id: AG-UI's tool results carry them."""
    ids = [f["execution_id"] for f in entry["facts"] if f["kind"] in OUTCOMES]
    if not ids:
        return {}
    rows = await store.read(lambda conn: store.executions.executions_by_id(conn, ids))
    return {k: {"result": v["result"], "error": v["error"]} for k, v in rows.items()}


async def answer(api: Api, namespace: str, a: Asked) -> tuple[str, int]:
    """Send the run's answers to the calls of the thread that wait for them; the turn they belong
    to, and the session's last seq before them (where its stream goes on from)."""
    key = session_key(namespace, a.session_id)
    rows = await api.store.read(
        lambda conn: api.store.sessions.turns_of(conn, key, thread_id(key, a.thread), None, 10_000, 0)
    )
    given = {**a.results, **a.resumes}
    for turn in reversed([r for r in rows if r["status"] not in TERMINAL_TURN]):
        said = await describe(api.store, namespace, turn["id"])
        waiting = {e["call_id"]: e["awaits"] for e in said["executions"] if e["status"] == "pending"}
        mine = {call: value for call, value in given.items() if call in waiting}
        if mine:
            break
    else:
        raise IllegalTransitionError(
            f"no call of thread {a.thread!r} of session {a.session_id!r} waits for the answers this run "
            f"sends ({', '.join(sorted(given))[:200]}): each was answered already, or never asked"
        )
    start = await api.store.read(lambda conn: api.store.journal.last_seq(conn, key))
    for call, value in sorted(mine.items()):
        if call in a.cancelled:
            said_ = Answer(call, "deny", reason="the client cancelled this call's interrupt")
        else:
            (said_,) = answers(value, [{"id": call, "value": {"awaits": waiting[call]}}])
        receipt = await controls.respond(
            api.store, namespace=namespace, turn_id=turn["id"], request_id=f"{a.request_id}:{call}",
            call=call, decision=said_.decision, result=said_.result, reason=said_.reason,
            wake_channel=api.wake_channel,
        )  # fmt: skip
        if receipt.status == "rejected":
            raise IllegalTransitionError(f"the answer to call {call} was refused: {receipt.reason}")
    return str(turn["id"]), int(start)


@router.post("/run")
async def run(request: Request, caller: CallerDep) -> EventSourceResponse:
    """Submit the turn an AG-UI client asks for (or answer what its turn waits for) and stream it as
    AG-UI events until it ends or waits for a person."""
    body = loads(await request.body())  # the one strict codec: a DecodeError (422) says where
    if not isinstance(body, dict):
        raise SchemaError("an AG-UI run takes a RunAgentInput object")
    a = asked(body)
    api, namespace = api_of(request), caller.tenant()
    first: list[Any] = []
    if a.results or a.resumes:
        turn_id, start = await answer(api, namespace, a)
        first = [RunStartedEvent(thread_id=a.session_id, run_id=a.request_id)]
    else:
        turn_id, _ = await verbs.submit(
            api.store, namespace=namespace, session_id=a.session_id, request_id=a.request_id,
            user_input=a.text or "", agent=a.agent, wake_channel=api.wake_channel, thread=a.thread,
            served=api.served, follow_edits=api.edits, tools=api.tools,
        )  # fmt: skip
        start = 0
    key = session_key(namespace, a.session_id)
    metadata = (await api.store.read(lambda conn: api.store.metadata.of(conn, SESSION, [key]))).get(key, {})
    events = AguiEvents({turn_id: (a.session_id, a.request_id)})
    where = observe.EventFilter(thread=a.thread, turn=turn_id)

    async def stream() -> AsyncIterator[dict[str, Any]]:
        for event in first:
            yield {"data": wire(event)}
        with api.previews.subscribe(key) as pieces:
            async for item in follow(
                request, namespace=namespace, session_id=a.session_id, start=start, where=where,
                pieces=pieces, events=events, until=turn_id, metadata=metadata,
            ):  # fmt: skip
                yield item

    return EventSourceResponse(stream(), ping=15, sep="\n")  # AG-UI clients split events on LF LF
