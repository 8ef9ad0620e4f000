"""The operator routes: what only an operator token reaches (the UNKNOWN executions, and
reconciling one with evidence through the Hands of its route; the messages the broker parked; the
routes and how many workers serve each; the Prometheus metrics)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse

from brain.api.app import Api
from brain.api.guard import CheckedRoute
from brain.api.models import Reconciled, ReconcileRequest
from brain.api.routes import ERRORS, CallerDep, api_of, seconds
from brain.rules.states import ExecutionStatus
from brain.run.metrics import CONTENT_TYPE
from brain.verbs import browse
from brain.verbs import reconcile as reconciling
from infra.db.parked import listing as parked_listing
from protocol import TransientError, new_id

router = APIRouter(prefix="/v1/operator", tags=["operator"], responses=ERRORS, route_class=CheckedRoute)
metrics = APIRouter(tags=["operator"], route_class=CheckedRoute)

RECONCILE_WAIT = 10.0  # seconds a reconcile waits for its outcome when the request says nothing


@router.post(
    "/executions/{execution_id}/reconcile",
    response_model=Reconciled,
    responses={202: {"model": Reconciled, "description": "committed; no worker of the route answered yet"}},
)
async def reconcile(
    execution_id: str,
    body: ReconcileRequest,
    request: Request,
    caller: CallerDep,
    wait: Annotated[str | None, Query(examples=["10s"])] = None,
) -> Any:
    """Resolve an UNKNOWN execution (of any namespace) as succeeded (``result``) or failed
    (``failure``), with evidence. The Hands of its route carry it out from their ledger (audited
    there: `hands show EXECUTION_ID`); this answers once the Brain applied their event (200), or,
    when none of them answered within ``wait`` (10 s unless said, at most a minute), with
    ``requested`` (202): the reconcile is committed, and is carried out once a worker serves the
    route. The same ``request_id`` again answers the same and sends nothing new."""
    caller.operate()
    api = api_of(request)
    limit = RECONCILE_WAIT if wait is None else seconds(wait)  # a bad value is refused first
    control = reconciling.reconcile_body(
        request_id=body.request_id or new_id(), evidence=body.evidence, actor=body.actor,
        outcome=body.outcome(),
    )  # fmt: skip
    requested = await reconciling.request(api.store, api.topology, execution_id, control, api.codec)
    if requested.controls and api.controls is not None:
        api.controls(requested.controls)  # committed: published now (the relay's sweep otherwise)
    answer = Reconciled(
        execution_id=execution_id, turn_id=requested.turn_id, route=requested.route,
        request_id=requested.request_id, status="requested",
    )  # fmt: skip
    now = await until_settled(api, execution_id, limit)
    if now["status"] == ExecutionStatus.UNKNOWN:
        answer.message = (
            f"no worker of route {requested.route} answered within {limit:g} s: the reconcile is committed "
            f"and is carried out once one serves route {requested.route} (ask again with request id "
            f"{requested.request_id!r} to see its outcome)"
        )
        return JSONResponse(answer.model_dump(), status_code=202)
    answer.status, answer.how, answer.evidence = now["status"], now["how"], now["evidence"]
    return answer


async def until_settled(api: Api, execution_id: str, wait: float) -> dict[str, Any]:
    """The execution as the Brain's record says once it left UNKNOWN, or when ``wait`` seconds
    passed (a look every ``api.wait_poll`` seconds: the outcome comes from whichever Brain applies
    the Hands' event)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        now = await reconciling.execution_status(api.store, execution_id)
        if now["status"] != ExecutionStatus.UNKNOWN or loop.time() >= deadline:
            return now
        await asyncio.sleep(min(api.wait_poll, deadline - loop.time()))


@router.get("/unknown")
async def unknown(
    request: Request, caller: CallerDep, limit: Annotated[int, Query(ge=1, le=500)] = 100
) -> list[dict[str, Any]]:
    """The UNKNOWN executions of every namespace, oldest first: each with why its Hands could not
    tell what happened (``reason``), its worker and attempts, and the turn that waits for its
    reconcile (``POST /v1/operator/executions/{id}/reconcile``)."""
    caller.operate()
    return await browse.unknown(api_of(request).store, limit=limit)


@router.get("/routes")
async def routes(request: Request, caller: CallerDep) -> list[dict[str, Any]]:
    """Every route a Hands pool announced tools for: its tools, when they were last announced,
    and how many workers consume its commands right now (0: nobody serves it, and its calls wait
    for one)."""
    caller.operate()
    api = api_of(request)
    if api.transport is None:
        raise TransientError("this Brain's API does not see its transport: the routes' workers are unknown")
    return await browse.routes(api.store, api.transport, api.topology)


@router.get("/parked")
async def parked(
    request: Request, caller: CallerDep, limit: Annotated[int, Query(ge=1, le=500)] = 50
) -> list[dict[str, Any]]:
    """The messages the broker parked for the Brain (newest first), and what was done about each."""
    caller.operate()
    return await parked_listing(api_of(request).store, limit)


@metrics.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE: {}}}})
async def prometheus(request: Request, caller: CallerDep) -> Response:
    """This Brain's metrics in Prometheus' text format (scrape it with the operator token)."""
    caller.operate()
    api = api_of(request)
    store = api.store
    text = await api.metrics.render(lambda: store.read(store.gauges.count))
    return Response(text, media_type=CONTENT_TYPE)
