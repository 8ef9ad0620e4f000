"""LangGraph crons: a cron on a thread is a Tendon schedule (``/v1/schedules``) submitting its
input into the thread's main thread, on the cron expression (UTC), each time once (invariant
19). Its id is the schedule's; its runs are the thread's runs (under their turns' request ids).
A cron is ``enabled`` unless paused. A cron without a thread, a time zone other than UTC and an
end time are refused, named."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request, Response

from brain.api.guard import CheckedRoute
from brain.api.langgraph.assistants import agent_of
from brain.api.langgraph.bodies import CronBody, CronSearch
from brain.api.langgraph.common import (
    GRAPH_INTERNALS,
    CallerDep,
    NotSupported,
    api_of,
    body_of,
    documented,
    matches,
    page,
    refuse,
    when,
)
from brain.api.langgraph.runflow import text_of
from brain.api.langgraph.threads import found
from brain.rules.submits import MAIN_THREAD
from brain.verbs import schedules
from protocol import NotFoundError, SchemaError

router = APIRouter(prefix="/langgraph", tags=["langgraph"], route_class=CheckedRoute)
_UNMAPPED = {
    **GRAPH_INTERNALS,
    "end_time": "not built yet: delete the cron when it should stop",
    "on_run_completed": "a cron's runs stay on its thread",
}


def shown(s: dict[str, Any]) -> dict[str, Any]:
    """A schedule as LangGraph's clients read a cron."""
    agent = str(s["agent"]).rpartition("@")[0]
    return {
        "cron_id": s["id"], "assistant_id": agent, "thread_id": s["session_id"], "schedule": s["cron"],
        "timezone": "UTC", "end_time": None, "on_run_completed": None, "user_id": None, "metadata": {},
        "payload": {"input": {"messages": [{"role": "user", "content": s["input"]}]}},
        "created_at": when(s["created_at"]), "updated_at": when(s["last_fired_at"] or s["created_at"]),
        "next_run_date": when(s["next_at"]), "enabled": not s["paused"],
    }  # fmt: skip


@router.post("/threads/{thread_id}/runs/crons", openapi_extra=documented(CronBody))
async def create(thread_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    body, api, namespace = await body_of(request, CronBody), api_of(request), caller.tenant()
    refuse(body, _UNMAPPED)
    if body.get("timezone") not in (None, "UTC", "Etc/UTC"):
        raise NotSupported(f"timezone {body['timezone']!r}: Tendon's schedules run on UTC")
    if not isinstance(body.get("schedule"), str) or not isinstance(body.get("assistant_id"), str):
        raise SchemaError("a cron takes a schedule (a cron expression) and an assistant_id")
    await found(api.store, namespace, thread_id)
    agent, _ = await agent_of(api.store, namespace, body["assistant_id"])
    if (
        api.edits is not None
    ):  # a development server's submits take versions from content: so do its schedules
        agent = agent.versioned_by_content()
    made = await schedules.create(
        api.store, namespace=namespace, request_id=f"lg-cron-{uuid.uuid4()}", session_id=thread_id,
        agent=agent, text=text_of(body.get("input")), cron=body["schedule"], thread=MAIN_THREAD,
    )  # fmt: skip
    if body.get("enabled") is False:
        made = await schedules.change(api.store, namespace=namespace, schedule_id=made["id"], action="pause")
    return shown(made)


@router.post("/runs/crons")
async def create_stateless(caller: CallerDep) -> None:
    raise NotSupported("a cron without a thread: make it on a thread (POST /threads/{id}/runs/crons)")


@router.patch("/runs/crons/{cron_id}")
async def update(cron_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """Enable or disable a cron (its other fields stay: delete it and make another)."""
    body, api, namespace = await body_of(request, CronBody), api_of(request), caller.tenant()
    others = sorted(k for k, v in body.items() if k != "enabled" and v is not None)
    if others:
        raise NotSupported(f"changing a cron's {', '.join(others)}: delete it and make another")
    action = "resume" if body.get("enabled", True) else "pause"
    return shown(await schedules.change(api.store, namespace=namespace, schedule_id=cron_id, action=action))


@router.delete("/runs/crons/{cron_id}", status_code=204)
async def delete(cron_id: str, request: Request, caller: CallerDep) -> Response:
    await schedules.change(
        api_of(request).store, namespace=caller.tenant(), schedule_id=cron_id, action="delete"
    )
    return Response(status_code=204)


async def _searched(request: Request, caller: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    body, api = await body_of(request, CronSearch), api_of(request)
    found_crons = [
        shown(s) for s in await schedules.listed(api.store, namespace=caller.tenant()) if s["cron"]
    ]
    for key in ("assistant_id", "thread_id", "enabled"):
        if body.get(key) is not None:
            found_crons = [c for c in found_crons if c[key] == body[key]]
    return [c for c in found_crons if matches(c["metadata"], body.get("metadata"))], body


@router.post("/runs/crons/search")
async def search(request: Request, caller: CallerDep) -> list[dict[str, Any]]:
    crons, body = await _searched(request, caller)
    return page(crons, body)


@router.post("/runs/crons/count")
async def count(request: Request, caller: CallerDep) -> int:
    crons, _ = await _searched(request, caller)
    return len(crons)


@router.get("/runs/crons/{cron_id}")
async def get(cron_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    crons, _ = await _searched(request, caller)
    for c in crons:
        if c["cron_id"] == cron_id:
            return c
    raise NotFoundError(f"there is no cron {cron_id!r}")
