"""The schedule routes: submit a turn into a thread on a cron expression or once after a delay;
list, pause, resume and delete schedules. Each acts in the caller's namespace."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from brain.api.guard import CheckedRoute
from brain.api.routes import ERRORS, CallerDep, api_of
from brain.rules.agents import AgentDefinition
from brain.verbs import schedules

router = APIRouter(prefix="/v1", responses=ERRORS, route_class=CheckedRoute)


class ScheduleRequest(BaseModel):
    """A schedule to make. The same request id with the same input answers the same schedule."""

    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(min_length=1, max_length=200, description="idempotency key, per namespace")
    session: str = Field(min_length=1, max_length=200, description="the session its turns go to")
    thread: str = Field(default="main", description="the session's thread (created on first use)")
    agent: AgentDefinition = Field(description="the agent definition its turns are submitted with")
    input: str = Field(description="each turn's input")
    cron: str | None = Field(default=None, description="five fields, or six with the seconds last (UTC)")
    delay: float | None = Field(default=None, ge=0, description="or: fire once, this many seconds from now")


@router.post("/schedules", tags=["schedules"])
async def create(body: ScheduleRequest, request: Request, caller: CallerDep) -> dict[str, Any]:
    return await schedules.create(
        api_of(request).store, namespace=caller.tenant(), request_id=body.request_id, session_id=body.session,
        agent=body.agent, text=body.input, cron=body.cron, delay=body.delay, thread=body.thread,
    )  # fmt: skip


@router.get("/schedules", tags=["schedules"])
async def listed(request: Request, caller: CallerDep) -> list[dict[str, Any]]:
    return await schedules.listed(api_of(request).store, namespace=caller.tenant())


@router.post("/schedules/{schedule_id}/{action}", tags=["schedules"])
async def change(
    schedule_id: str, action: Literal["pause", "resume"], request: Request, caller: CallerDep
) -> dict[str, Any]:
    """Pause a schedule (it does not fire) or resume it."""
    return await schedules.change(
        api_of(request).store, namespace=caller.tenant(), schedule_id=schedule_id, action=action
    )


@router.delete("/schedules/{schedule_id}", tags=["schedules"])
async def delete(schedule_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """Delete a schedule: ``{"id", "state": "deleted"}``."""
    store = api_of(request).store
    return await schedules.change(store, namespace=caller.tenant(), schedule_id=schedule_id, action="delete")
