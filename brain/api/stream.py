"""Server-Sent Events: a session's journal followed live, resumable with ``Last-Event-ID``.

Each committed journal entry is one event whose id is its seq, so a client that reconnects with
the last id it saw gets every later event exactly once, in order. A cursor older than what is
kept answers 410 when the stream opens; if retention overtakes a stream while it runs, a
``resync`` event says so (with the cursor of a fresh snapshot) instead of skipping anything.
With ``previews=true`` the pieces of model replies being streamed (text and tool-call arguments)
go out too, as ``preview`` events without an id: never stored, never replayed. Closing a stream
changes nothing of the work (invariant 13).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request
from sse_starlette.sse import EventSourceResponse

from brain.api import stream_schema
from brain.api.guard import CheckedRoute
from brain.api.models import INT64
from brain.api.routes import CallerDep, FilterDep, api_of
from brain.rules.names import shown
from brain.rules.submits import session_key
from brain.verbs import observe
from protocol import GoneError, NotFoundError, SchemaError

router = APIRouter(prefix="/v1", tags=["events"], route_class=CheckedRoute)
PAGE = 200


@router.get(
    "/sessions/{session_id}/stream", response_class=EventSourceResponse, responses=stream_schema.responses()
)
async def stream(
    session_id: str,
    request: Request,
    caller: CallerDep,
    where: FilterDep,
    cursor: Annotated[
        int | None, Query(ge=0, le=INT64, description="follow from here (else Last-Event-ID, else 0)")
    ] = None,
    previews: bool = False,
    format: Annotated[
        Literal["tendon", "ag-ui"], Query(description="`ag-ui`: AG-UI events (brain.api.agui)")
    ] = "tendon",
    pending: Annotated[
        bool, Query(description="a session with no turn yet is waited for (its first submit), not a 404")
    ] = False,
    last_event_id: Annotated[str | None, Header()] = None,
) -> EventSourceResponse:
    """The session's events as Server-Sent Events, from ``cursor`` (or ``Last-Event-ID``) on."""
    api = api_of(request)
    namespace = caller.tenant()
    start = cursor if cursor is not None else _last_id(last_event_id)
    # Checked before the stream opens, so that an expired cursor or a foreign session is an error
    # answer (410, 404), not a stream that ends at once. A session asked for as ``pending`` may not
    # exist yet: its stream waits for it (another namespace's session of that id is not it).
    try:
        await observe.list_events(
            api.store, namespace=namespace, session_id=session_id, cursor=start, limit=1, where=where
        )
    except NotFoundError:
        if not pending or start or where != observe.EventFilter():
            raise

    if format == "ag-ui":
        from brain.api.agui import session_stream  # it imports this module's previews_for

        return session_stream(request, namespace, session_id, start, where, previews=previews)

    return EventSourceResponse(
        _follow(request, namespace, session_id, start, where, previews=previews), ping=15
    )


async def _follow(
    request: Request,
    namespace: str,
    session_id: str,
    start: int,
    where: observe.EventFilter,
    *,
    previews: bool,
) -> AsyncIterator[dict[str, Any]]:
    """The session's entries from ``start`` on as they commit, with previews if asked."""
    api, position = api_of(request), start
    key = session_key(namespace, session_id)  # how previews know the session
    with api.previews.subscribe(key) if previews else contextlib.nullcontext() as pieces:
        while not await request.is_disconnected():
            try:
                page = await observe.list_events(
                    api.store, namespace=namespace, session_id=session_id, cursor=position, limit=PAGE,
                    where=where,
                )  # fmt: skip
            except NotFoundError:  # a pending session that has had no submit yet
                await asyncio.sleep(api.poll)
                continue
            except GoneError as exc:
                fresh = await observe.snapshot(
                    api.store, namespace=namespace, session_id=session_id, where=where
                )
                position = fresh["cursor"]
                yield {"event": "resync", "data": json.dumps({"reason": exc.message, "cursor": position})}
                continue
            for e in page.events:
                yield {"id": str(e["seq"]), "event": "entry", "data": json.dumps(e, default=str)}
            position = page.cursor
            if len(page.events) == PAGE:
                continue
            async for piece in previews_for(pieces, api.poll):
                yield piece


async def previews_for(pieces: asyncio.Queue[Any] | None, seconds: float) -> AsyncIterator[dict[str, Any]]:
    """Wait ``seconds`` for the next look at the journal, passing on the previews that come."""
    if pieces is None:
        await asyncio.sleep(seconds)
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := deadline - loop.time()) > 0:
        try:
            piece = await asyncio.wait_for(pieces.get(), left)
        except TimeoutError:
            return
        yield {"event": "preview", "data": json.dumps(piece.as_dict())}


def _last_id(value: str | None) -> int:
    """The ``Last-Event-ID`` header as the journal seq it must be: ASCII digits only (``isdigit``
    takes ``²`` too, which ``int`` does not), at most a bigint's."""
    text = (value or "").strip(" \t")  # HTTP's own white space (str.strip takes "\x85" too)
    if not text:
        return 0
    if not re.fullmatch(r"[0-9]{1,19}", text) or int(text) > INT64:
        raise SchemaError(f"Last-Event-ID must be an event id (a journal seq), not {shown(value or '')}")
    return int(text)
