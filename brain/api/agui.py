"""AG-UI over HTTP: a session's stream in AG-UI's events, and AG-UI's run endpoint.

- ``GET /v1/sessions/{id}/stream?format=ag-ui`` (``brain.api.stream``) follows the session as the
  native stream does, resumable with ``Last-Event-ID``, each event one AG-UI event (mapping in
  ``brain.api.agui_events``). An entry's events carry its seq as their id on the last one only: a
  reader cut off inside an entry gets that entry again, never loses part of it.
- ``POST /v1/agui/run`` takes AG-UI's ``RunAgentInput``: its ``threadId`` is the session, its
  ``runId`` the submit's request id (a repeated run request answers the same turn), its last user
  message the input, and ``forwardedProps.agent`` the agent definition (as a submit's ``agent``;
  ``forwardedProps.thread`` names another thread than ``main``). It submits the turn and streams
  it, from its start, until it ends, under the thread and run ids the client sent.

"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import nullcontext as nothing
from typing import Any

from ag_ui.core import RunAgentInput
from fastapi import APIRouter, Request
from sse_starlette.sse import EventSourceResponse

from brain import verbs
from brain.api.agui_events import OUTCOMES, AguiEvents, wire
from brain.api.guard import CheckedRoute
from brain.api.routes import CallerDep, api_of
from brain.api.stream import previews_for
from brain.rules.agents import AgentDefinition
from brain.rules.submits import session_key
from brain.verbs import observe
from protocol import SchemaError, loads

router = APIRouter(prefix="/v1/agui", tags=["ag-ui"], route_class=CheckedRoute)
PAGE = 200


async def follow(
    request: Request, *, namespace: str, session_id: str, start: int, where: observe.EventFilter,
    pieces: asyncio.Queue[Any] | None, events: Any, until: str | None = None,
) -> AsyncIterator[dict[str, Any]]:  # fmt: skip
    """The session's entries from ``start`` (and previews, if ``pieces``) as AG-UI events; with
    ``until``, ends after that turn's end."""
    api, position = api_of(request), start
    while not await request.is_disconnected():
        page = await observe.list_events(
            api.store, namespace=namespace, session_id=session_id, cursor=position, limit=PAGE, where=where
        )
        for e in page.events:
            said = events.entry(e, await _outcomes(api.store, e))
            for i, event in enumerate(said):
                yield {"data": wire(event), **({"id": str(e["seq"])} if i == len(said) - 1 else {})}
            if until is not None and e["turn_id"] == until and e.get("status") in _ENDED:
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


def _input_of(body: Mapping[str, Any]) -> tuple[str, str, str, AgentDefinition, str]:
    """(session, request id, input, agent, thread) from a RunAgentInput, checked by its model."""
    try:
        run = RunAgentInput.model_validate(body)
    except ValueError as exc:
        raise SchemaError(f"not an AG-UI RunAgentInput: {str(exc).splitlines()[0]}") from exc
    users = [m for m in run.messages if m.role == "user"]
    if not users:
        raise SchemaError("an AG-UI run needs a user message: the turn's input")
    content = users[-1].content
    text = content if isinstance(content, str) else "".join(getattr(p, "text", "") for p in content)
    props = run.forwarded_props if isinstance(run.forwarded_props, dict) else {}
    if "agent" not in props:
        raise SchemaError("an AG-UI run names its Tendon agent in forwardedProps.agent (a definition)")
    agent = AgentDefinition.model_validate(props["agent"])
    return run.thread_id, run.run_id, text, agent, str(props.get("thread") or "main")


@router.post("/run")
async def run(request: Request, caller: CallerDep) -> EventSourceResponse:
    """Submit the turn an AG-UI client asks for and stream it as AG-UI events until it ends."""
    body = loads(await request.body())  # the one strict codec: a DecodeError (422) says where
    if not isinstance(body, dict):
        raise SchemaError("an AG-UI run takes a RunAgentInput object")
    session_id, request_id, text, agent, thread = _input_of(body)
    api, namespace = api_of(request), caller.tenant()
    turn_id, _ = await verbs.submit(
        api.store, namespace=namespace, session_id=session_id, request_id=request_id, user_input=text,
        agent=agent, wake_channel=api.wake_channel, thread=thread, served=api.served, follow_edits=api.edits,
        tools=api.tools,
    )  # fmt: skip
    events = AguiEvents({turn_id: (session_id, request_id)})
    where = observe.EventFilter(thread=thread, turn=turn_id)

    async def stream() -> AsyncIterator[dict[str, Any]]:
        with api.previews.subscribe(session_key(namespace, session_id)) as pieces:
            async for item in follow(
                request, namespace=namespace, session_id=session_id, start=0, where=where, pieces=pieces,
                events=events, until=turn_id,
            ):  # fmt: skip
                yield item

    return EventSourceResponse(stream(), ping=15, sep="\n")  # AG-UI clients split events on LF LF
