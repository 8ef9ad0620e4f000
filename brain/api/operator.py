"""The operator routes: what only an operator token reaches (reconciling an UNKNOWN execution with
evidence, the messages the broker parked, and the Prometheus metrics)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from brain.api.models import ReconcileRequest
from brain.api.routes import CallerDep, api_of
from brain.run.metrics import CONTENT_TYPE
from infra.transport.parked import listing as parked_listing
from protocol import SchemaError, TendonError

router = APIRouter(prefix="/v1/operator", tags=["operator"])
metrics = APIRouter(tags=["operator"])


@router.post("/executions/{execution_id}/reconcile")
async def reconcile(
    execution_id: str, body: ReconcileRequest, request: Request, caller: CallerDep
) -> dict[str, Any]:
    """Resolve an UNKNOWN execution as succeeded (``result``) or failed (``failure``), with
    evidence; the pool's relay tells the Brain."""
    caller.operate()
    api = api_of(request)
    if api.reconciler is None:
        raise TendonError("this server cannot reach the Hands ledger to reconcile")
    if body.failure is not None and body.result is not None:
        raise SchemaError("give a result or a failure, not both")
    options: dict[str, Any] = (
        {"failure": body.failure} if body.failure is not None else {"result": body.result}
    )
    done = await api.reconciler(execution_id, evidence=body.evidence, actor=body.actor, **options)
    return {"execution_id": execution_id, "status": done.execution.status.value, "audit_id": done.audit_id}


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
