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
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from sse_starlette.sse import EventSourceResponse

from brain.api.guard import CheckedRoute
from brain.api.models import INT64
from brain.api.routes import CallerDep, FilterDep, api_of
from brain.rules.names import shown
from brain.verbs import observe
from protocol import GoneError, SchemaError

router = APIRouter(prefix="/v1", tags=["events"], route_class=CheckedRoute)
PAGE = 200


@router.get("/sessions/{session_id}/stream")
async def stream(
    session_id: str,
    request: Request,
    caller: CallerDep,
    where: FilterDep,
    cursor: Annotated[
        int | None, Query(ge=0, le=INT64, description="follow from here (else Last-Event-ID, else 0)")
    ] = None,
    previews: bool = False,
    last_event_id: Annotated[str | None, Header()] = None,
) -> EventSourceResponse:
    """The session's events as Server-Sent Events, from ``cursor`` (or ``Last-Event-ID``) on."""
    api = api_of(request)
    namespace = caller.tenant()
    start = cursor if cursor is not None else _last_id(last_event_id)
    # Checked before the stream opens, so that an expired cursor or a foreign session is an error
    # answer (410, 404), not a stream that ends at once.
    first = await observe.list_events(
        api.store, namespace=namespace, session_id=session_id, cursor=start, limit=1, where=where
    )
    del first

    async def follow() -> AsyncIterator[dict[str, Any]]:
        position = start
        with api.previews.subscribe(session_id) if previews else contextlib.nullcontext() as pieces:
            while not await request.is_disconnected():
                try:
                    page = await observe.list_events(
                        api.store, namespace=namespace, session_id=session_id, cursor=position, limit=PAGE,
                        where=where,
                    )  # fmt: skip
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
                async for piece in _previews_for(pieces, api.poll):
                    yield piece

    return EventSourceResponse(follow(), ping=15)


async def _previews_for(pieces: asyncio.Queue[Any] | None, seconds: float) -> AsyncIterator[dict[str, Any]]:
    """Wait ``seconds`` for the next look at the journal, passing on the previews that come."""
    if pieces is None:
        await asyncio.sleep(seconds)
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := deadline - loop.time()) > 0:
        try:
            turn_id, delta = await asyncio.wait_for(pieces.get(), left)
        except TimeoutError:
            return
        yield {
            "event": "preview",
            "data": json.dumps({"turn_id": turn_id, **delta.model_dump(exclude_none=True)}),
        }


def _last_id(value: str | None) -> int:
    """The ``Last-Event-ID`` header as the journal seq it must be: ASCII digits only (``isdigit``
    takes ``²`` too, which ``int`` does not), at most a bigint's."""
    text = (value or "").strip(" \t")  # HTTP's own white space (str.strip takes "\x85" too)
    if not text:
        return 0
    if not re.fullmatch(r"[0-9]{1,19}", text) or int(text) > INT64:
        raise SchemaError(f"Last-Event-ID must be an event id (a journal seq), not {shown(value or '')}")
    return int(text)
