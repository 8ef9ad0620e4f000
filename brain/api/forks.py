"""Fork and rewind routes (``brain.verbs.forks``): a thread's id is its namespace's view of it, the
session id for a session's main thread or ``session/name`` for another (its ``/`` may be sent
as it is or as ``%2F``). Each acts in the caller's namespace: another's thread is not found."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from brain.api.guard import CheckedRoute
from brain.api.models import INT64, JSON
from brain.api.routes import ERRORS, CallerDep, api_of
from brain.rules.names import MAX_THREAD_NAME
from brain.verbs import forks
from protocol.codec import dumps

router = APIRouter(prefix="/v1", responses=ERRORS, route_class=CheckedRoute, tags=["sessions"])
At = Annotated[int, Query(ge=0, le=INT64, description="the journal seq of the thread's session to cut at")]


@router.post(
    "/threads/{thread_id:path}/fork", status_code=201, responses={200: {"description": "made before"}}
)
async def fork(
    thread_id: str,
    request: Request,
    caller: CallerDep,
    at: Annotated[
        int | None, Query(ge=0, le=INT64, description="the seq to cut at (default: the last)")
    ] = None,
    name: Annotated[
        str | None, Query(max_length=MAX_THREAD_NAME, description="the new thread's name")
    ] = None,
) -> Response:
    """A new thread of the same session, agent version and tools whose conversation is this
    thread's as it stood at ``at``, snapped back to where every tool call had its result. The same
    ``name`` again answers the same fork (200)."""
    made = await forks.fork(api_of(request).store, caller.tenant(), thread_id, at, name=name)
    return Response(dumps(made), status_code=201 if made["created"] else 200, media_type=JSON)


@router.post("/threads/{thread_id:path}/rewind")
async def rewind(thread_id: str, request: Request, caller: CallerDep, at: At) -> dict[str, Any]:
    """Set an idle thread's conversation back to what it was at ``at`` (snapped back likewise)."""
    return await forks.rewind(api_of(request).store, caller.tenant(), thread_id, at)
