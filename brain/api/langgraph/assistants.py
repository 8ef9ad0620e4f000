"""LangGraph assistants: an agent of the namespace (``graph_id`` is the agent's name) under an id,
with numbered versions, each an agent definition's version. Its definition is given in
``context.agent`` (as a submit's ``agent``; its name defaults to the graph id, and without a
version it is versioned by its content), or, without one, it is the agent of that name the
namespace ran last. A run may also name a graph id as its assistant: that agent, as ran last."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import ValidationError

from brain.api.guard import CheckedRoute
from brain.api.langgraph.bodies import AssistantBody, AssistantSearch, Latest, Page
from brain.api.langgraph.common import (
    CallerDep,
    NotSupported,
    api_of,
    body_of,
    documented,
    matches,
    page,
    when,
)
from brain.rules.agents import AgentDefinition
from brain.rules.names import MAX_SESSION_ID, check_id
from brain.store import BrainStore
from infra.db import Connection
from protocol import ConflictError, NotFoundError, SchemaError

router = APIRouter(prefix="/langgraph", tags=["langgraph"], route_class=CheckedRoute)
_FIELDS = ("name", "description", "config", "context", "metadata")


def shown(row: Any) -> dict[str, Any]:
    """An assistant (at one version) as LangGraph's clients read it."""
    body = row["body"]
    return {
        "assistant_id": row["id"], "graph_id": row["graph_id"], "version": row["version"],
        "name": body.get("name") or row["graph_id"], "description": body.get("description"),
        "config": body.get("config") or {}, "context": body.get("context") or {},
        "metadata": body.get("metadata") or {}, "created_at": when(row["version_created_at"]),
        "updated_at": when(row["updated_at"]),
    }  # fmt: skip


async def definition(
    store: BrainStore, conn: Connection, namespace: str, graph_id: str, body: dict[str, Any]
) -> AgentDefinition:
    """The agent definition of an assistant's version (registered in the namespace)."""
    given = (body.get("context") or {}).get("agent") if isinstance(body.get("context"), dict) else None
    if given is None:
        stored = await store.langgraph.latest_agent(conn, namespace, graph_id)
        if stored is None:
            raise NotFoundError(
                f"there is no agent {graph_id!r} in this namespace: give its definition in context.agent"
            )
        return AgentDefinition.model_validate(stored)
    if not isinstance(given, dict):
        raise SchemaError("context.agent must be an agent definition (an object)")
    if given.get("name", graph_id) != graph_id:
        raise SchemaError(f"context.agent is named {given.get('name')!r}, not the graph id {graph_id!r}")
    try:
        agent = AgentDefinition.model_validate({"version": "1", **given, "name": graph_id})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise SchemaError(f"context.agent.{where}: {first['msg']}") from None
    if "version" not in given:
        agent = agent.versioned_by_content()
    await store.langgraph.register_agent(conn, namespace, agent)
    return agent


async def agent_of(store: BrainStore, namespace: str, assistant_id: str) -> tuple[AgentDefinition, str]:
    """The agent a run of ``assistant_id`` (an assistant's id, or a graph id) runs, and the
    assistant id its run shows."""

    async def work(conn: Connection) -> tuple[AgentDefinition, str]:
        row = await store.langgraph.assistant(conn, namespace, assistant_id)
        if row is None:
            return await definition(store, conn, namespace, assistant_id, {}), assistant_id
        stored = await store.bindings.agent_definition(conn, namespace, row["graph_id"], row["agent_version"])
        return AgentDefinition.model_validate(stored), assistant_id

    return await store.transact(work)


@router.post("/assistants", openapi_extra=documented(AssistantBody))
async def create(request: Request, caller: CallerDep) -> dict[str, Any]:
    body = await body_of(request, AssistantBody)
    graph_id, store, namespace = body.get("graph_id"), api_of(request).store, caller.tenant()
    if not isinstance(graph_id, str) or not graph_id:
        raise SchemaError("an assistant needs a graph_id: the name of a Tendon agent")
    assistant_id = body.get("assistant_id") or str(uuid.uuid4())
    check_id("assistant id", assistant_id, MAX_SESSION_ID)

    async def work(conn: Connection) -> Any:
        if not await store.langgraph.add_assistant(conn, namespace, assistant_id, graph_id):
            if body.get("if_exists") == "do_nothing":
                return await store.langgraph.assistant(conn, namespace, assistant_id)
            raise ConflictError(f"assistant {assistant_id!r} exists (if_exists=do_nothing takes it)")
        agent = await definition(store, conn, namespace, graph_id, body)
        kept = {k: body.get(k) for k in _FIELDS}
        await store.langgraph.add_version(conn, namespace, assistant_id, agent.version, kept)
        return await store.langgraph.assistant(conn, namespace, assistant_id)

    return shown(await store.transact(work, read_then_insert=True))


@router.get("/assistants/{assistant_id}")
async def get(assistant_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    store = api_of(request).store
    row = await store.read(lambda conn: store.langgraph.assistant(conn, caller.tenant(), assistant_id))
    if row is None:
        raise NotFoundError(f"there is no assistant {assistant_id!r}")
    return shown(row)


@router.patch("/assistants/{assistant_id}")
async def update(assistant_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """A new version, made of the one runs use now and what the request changes."""
    body, store, namespace = await body_of(request, AssistantBody), api_of(request).store, caller.tenant()

    async def work(conn: Connection) -> Any:
        row = await store.langgraph.assistant(conn, namespace, assistant_id)
        if row is None:
            raise NotFoundError(f"there is no assistant {assistant_id!r}")
        if body.get("graph_id") not in (None, row["graph_id"]):
            raise NotSupported("an assistant keeps its graph id: make another assistant for another agent")
        kept = {k: body[k] if body.get(k) is not None else row["body"].get(k) for k in _FIELDS}
        if isinstance(body.get("context"), dict) and "agent" in body["context"]:
            agent = await definition(store, conn, namespace, row["graph_id"], kept)
            version = agent.version
        else:
            version = row["agent_version"]
        await store.langgraph.add_version(conn, namespace, assistant_id, version, kept)
        return await store.langgraph.assistant(conn, namespace, assistant_id)

    return shown(await store.transact(work))


@router.delete("/assistants/{assistant_id}", status_code=204)
async def delete(assistant_id: str, request: Request, caller: CallerDep) -> Response:
    """Forget an assistant (its agent's versions stay: threads run them)."""
    if request.query_params.get("delete_threads") in ("true", "True", "1"):
        raise NotSupported(
            "delete_threads: delete the threads one by one (a thread with unfinished runs is kept)"
        )
    await get(assistant_id, request, caller)
    store = api_of(request).store
    await store.transact(lambda conn: store.langgraph.delete_assistant(conn, caller.tenant(), assistant_id))
    return Response(status_code=204)


async def _searched(request: Request, caller: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    body, store = await body_of(request, AssistantSearch), api_of(request).store
    graph_id = body.get("graph_id")
    rows = await store.read(lambda conn: store.langgraph.assistants(conn, caller.tenant(), graph_id))
    found = [shown(r) for r in rows]
    found = [a for a in found if matches(a["metadata"], body.get("metadata"))]
    if body.get("name"):
        found = [a for a in found if str(body["name"]).lower() in a["name"].lower()]
    return found, body


@router.post("/assistants/search")
async def search(request: Request, caller: CallerDep) -> list[dict[str, Any]]:
    found, body = await _searched(request, caller)
    if body.get("sort_by"):
        reverse = body.get("sort_order", "desc") == "desc"
        found.sort(key=lambda a: str(a.get(body["sort_by"])), reverse=reverse)
    return page(found, body)


@router.post("/assistants/count")
async def count(request: Request, caller: CallerDep) -> int:
    found, _ = await _searched(request, caller)
    return len(found)


@router.post("/assistants/{assistant_id}/versions")
async def versions(assistant_id: str, request: Request, caller: CallerDep) -> list[dict[str, Any]]:
    body, store = await body_of(request, Page), api_of(request).store
    rows = await store.read(lambda conn: store.langgraph.versions(conn, caller.tenant(), assistant_id))
    if not rows:
        raise NotFoundError(f"there is no assistant {assistant_id!r}")
    found = [shown(r) for r in rows]
    return page([a for a in found if matches(a["metadata"], body.get("metadata"))], body)


@router.post("/assistants/{assistant_id}/latest")
async def latest(assistant_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """Make one version the one runs use."""
    body, store, namespace = await body_of(request, Latest), api_of(request).store, caller.tenant()
    version = body["version"]

    async def work(conn: Connection) -> Any:
        if await store.langgraph.assistant(conn, namespace, assistant_id, version) is None:
            raise NotFoundError(f"assistant {assistant_id!r} has no version {version}")
        await store.langgraph.set_latest(conn, namespace, assistant_id, version)
        return await store.langgraph.assistant(conn, namespace, assistant_id)

    return shown(await store.transact(work))


# Every Tendon agent is the same loop: the model, then the tools it called, until it answers.
LOOP = {
    "nodes": [{"id": n, "type": "runnable", "data": n} for n in ("__start__", "model", "tools", "__end__")],
    "edges": [
        {"source": "__start__", "target": "model"},
        {"source": "model", "target": "tools", "conditional": True},
        {"source": "model", "target": "__end__", "conditional": True},
        {"source": "tools", "target": "model"},
    ],
}
MESSAGES = {
    "type": "object",
    "properties": {"messages": {"type": "array", "items": {"type": "object"}}},
    "required": ["messages"],
}


@router.get("/assistants/{assistant_id}/{what}")
async def drawn(assistant_id: str, what: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """The assistant's graph (the agent loop every Tendon agent runs, its nodes named as the
    stream's updates name them), its schemas (a state of messages; the context holds the agent
    definition) and its subgraphs (none)."""
    found = await get(assistant_id, request, caller)
    if what == "graph":
        return LOOP
    if what == "subgraphs":
        return {}
    if what == "schemas":
        context = {"type": "object", "properties": {"agent": AgentDefinition.model_json_schema()}}
        return {"graph_id": found["graph_id"], "input_schema": MESSAGES, "output_schema": MESSAGES,
                "state_schema": MESSAGES, "config_schema": {}, "context_schema": context}  # fmt: skip
    raise NotFoundError(f"an assistant has no {what!r} (its graph, schemas or subgraphs)")
