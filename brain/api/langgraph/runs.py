"""LangGraph runs: create (in the background), wait, stream, join, join a stream, cancel, list, get;
on a thread, or stateless (on a new thread). A run is a turn (``runflow``); its stream is the
turn's journal (``runstream``)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse

from brain.api.guard import CheckedRoute
from brain.api.langgraph import cancels, runflow, runstream
from brain.api.langgraph.bodies import CancelMany, RunBody
from brain.api.langgraph.common import CallerDep, NotSupported, api_of, body_of, documented, thread_key
from brain.api.langgraph.threads import found
from protocol import NotFoundError, SchemaError

router = APIRouter(prefix="/langgraph", tags=["langgraph"], route_class=CheckedRoute)
STATUSES = ("pending", "running", "error", "success", "timeout", "interrupted")


def _where(request: Request, run: runflow.Run) -> dict[str, str]:
    """The run's address (the SDK's ``on_run_created``) and its stream's (where it reconnects)."""
    ids = quote(run.thread_id, safe=""), quote(run.run_id, safe="")  # a header holds Latin-1 only
    base = f"{str(request.base_url).rstrip('/')}/langgraph/threads/{ids[0]}/runs/{ids[1]}"
    return {"Content-Location": base, "Location": f"{base}/stream"}


async def _view(request: Request, run: runflow.Run) -> dict[str, Any]:
    (view,) = await runflow.shown(api_of(request), [run], hide_rolled_back=False)
    return view


async def _create(request: Request, namespace: str, thread_id: str | None) -> runflow.Run:
    return await runflow.create(api_of(request), namespace, thread_id, await body_of(request, RunBody))


def _stream(
    request: Request, namespace: str, run: runflow.Run, modes: list[str], cancel: bool
) -> EventSourceResponse:
    seen = runstream.last_seen(request.headers.get("last-event-id"))
    events = runstream.follow(
        request, api_of(request), namespace, run, modes, seen, cancel_on_disconnect=cancel
    )
    return EventSourceResponse(events, ping=15, headers=_where(request, run))


@router.post("/threads/{thread_id}/runs", openapi_extra=documented(RunBody))
async def create(thread_id: str, request: Request, caller: CallerDep) -> JSONResponse:
    """A run in the background: answered once its turn is accepted (committed)."""
    run = await _create(request, caller.tenant(), thread_id)
    return JSONResponse(
        await _view(request, run), headers={"Content-Location": _where(request, run)["Content-Location"]}
    )


@router.post("/runs", openapi_extra=documented(RunBody))
async def create_stateless(request: Request, caller: CallerDep) -> JSONResponse:
    run = await _create(request, caller.tenant(), None)
    return JSONResponse(
        await _view(request, run), headers={"Content-Location": _where(request, run)["Content-Location"]}
    )


@router.post("/threads/{thread_id}/runs/stream", openapi_extra=documented(RunBody))
async def stream(thread_id: str, request: Request, caller: CallerDep) -> EventSourceResponse:
    """A run, and its parts as they commit."""
    run = await _create(request, caller.tenant(), thread_id)
    return _stream(request, caller.tenant(), run, run.modes, run.body["on_disconnect"] == "cancel")


@router.post("/runs/stream", openapi_extra=documented(RunBody))
async def stream_stateless(request: Request, caller: CallerDep) -> EventSourceResponse:
    run = await _create(request, caller.tenant(), None)
    return _stream(request, caller.tenant(), run, run.modes, run.body["on_disconnect"] == "cancel")


@router.post("/threads/{thread_id}/runs/wait", openapi_extra=documented(RunBody))
async def wait(thread_id: str, request: Request, caller: CallerDep) -> JSONResponse:
    """A run, answered with the thread's values once it ended or stopped at an interrupt."""
    run = await _create(request, caller.tenant(), thread_id)
    values = await runstream.join(api_of(request), caller.tenant(), run, request)
    return JSONResponse(values, headers={"Content-Location": _where(request, run)["Content-Location"]})


@router.post("/runs/wait", openapi_extra=documented(RunBody))
async def wait_stateless(request: Request, caller: CallerDep) -> JSONResponse:
    run = await _create(request, caller.tenant(), None)
    values = await runstream.join(api_of(request), caller.tenant(), run, request)
    return JSONResponse(values, headers={"Content-Location": _where(request, run)["Content-Location"]})


@router.get("/threads/{thread_id}/runs")
async def listed(thread_id: str, request: Request, caller: CallerDep) -> list[dict[str, Any]]:
    """The thread's runs, newest first (``limit``, ``offset``, ``status``)."""
    api, namespace = api_of(request), caller.tenant()
    await found(api.store, namespace, thread_id)
    views = await runflow.shown(api, await runflow.runs_of(api, namespace, thread_key(namespace, thread_id)))
    status = request.query_params.get("status")
    if status is not None and status not in STATUSES:
        raise SchemaError(f"status is one of {', '.join(STATUSES)}")
    views = [v for v in views if status in (None, v["status"])]
    try:
        limit, offset = int(request.query_params.get("limit", 10)), int(request.query_params.get("offset", 0))
    except ValueError:
        raise SchemaError("limit and offset are integers") from None
    return views[max(0, offset) : max(0, offset) + max(1, min(limit, 1000))]


@router.get("/threads/{thread_id}/runs/{run_id}")
async def get(thread_id: str, run_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    run = await runflow.get(api_of(request), caller.tenant(), thread_id, run_id)
    views = await runflow.shown(api_of(request), [run])
    if not views:
        raise NotFoundError(f"run {run_id} was rolled back: it is gone from its thread")
    return views[0]


@router.delete("/threads/{thread_id}/runs/{run_id}")
async def delete(thread_id: str, run_id: str, caller: CallerDep) -> None:
    raise NotSupported("deleting a run: Tendon's journal keeps every turn (cancel it with action=rollback)")


@router.get("/threads/{thread_id}/runs/{run_id}/join")
async def join(thread_id: str, run_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    run = await runflow.get(api_of(request), caller.tenant(), thread_id, run_id)
    return await runstream.join(api_of(request), caller.tenant(), run)


@router.get("/threads/{thread_id}/runs/{run_id}/stream")
async def join_stream(
    thread_id: str, run_id: str, request: Request, caller: CallerDep
) -> EventSourceResponse:
    """The run's parts again (from after ``Last-Event-ID``), in its modes or in ``stream_mode``."""
    run = await runflow.get(api_of(request), caller.tenant(), thread_id, run_id)
    asked = [m for m in request.query_params.getlist("stream_mode") if m]
    modes = runflow.stream_modes(asked) if asked else run.modes
    cancel = request.query_params.get("cancel_on_disconnect", "false").lower() in ("true", "1")
    return _stream(request, caller.tenant(), run, modes, cancel)


@router.post("/threads/{thread_id}/runs/{run_id}/cancel")
async def cancel(thread_id: str, run_id: str, request: Request, caller: CallerDep) -> Response:
    """Cancel the run's turn (``action=interrupt``, or ``rollback``: its messages leave the
    thread); with ``wait=1``, answered once it ended."""
    api, namespace = api_of(request), caller.tenant()
    run = await runflow.get(api, namespace, thread_id, run_id)
    await cancels.cancel(api, namespace, run, request.query_params.get("action", "interrupt"))
    if request.query_params.get("wait") in ("1", "true", "True"):
        await runstream.join(api, namespace, run)
        return Response(status_code=204)
    return Response(status_code=202)


@router.post("/runs/cancel")
async def cancel_many(request: Request, caller: CallerDep) -> Response:
    """Cancel runs by id (of ``thread_id``), or every unfinished run of the thread."""
    api, namespace, body = api_of(request), caller.tenant(), await body_of(request, CancelMany)
    if body.get("status") is not None or not isinstance(body.get("thread_id"), str):
        raise NotSupported("cancelling runs by status across threads: cancel them by thread_id (and run_ids)")
    thread_id, action = body["thread_id"], request.query_params.get("action", "interrupt")
    ids = body.get("run_ids")
    if ids is None:
        views = await runflow.shown(
            api, await runflow.runs_of(api, namespace, thread_key(namespace, thread_id))
        )
        ids = [v["run_id"] for v in views if v["status"] in ("pending", "running")]
    for run_id in ids:
        await cancels.cancel(
            api, namespace, await runflow.get(api, namespace, thread_id, str(run_id)), action
        )
    return Response(status_code=204)


@router.get("/threads/{thread_id}/stream")
async def thread_stream(thread_id: str, caller: CallerDep) -> None:
    raise NotSupported("a thread's stream: join a run's stream (GET /threads/{id}/runs/{run_id}/stream)")
