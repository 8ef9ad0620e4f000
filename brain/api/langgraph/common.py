"""What every LangGraph route shares: who calls (the /v1 bearer tokens, also taken as LangGraph's
``x-api-key``), its namespace's store keys, strict bodies, and the refusal of what does not map."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, Request
from pydantic import BaseModel

from brain.api.app import Api
from brain.api.auth import Caller
from brain.api.langgraph.bodies import Loose
from brain.api.models import JSON, inlined, parsed
from brain.rules.metadata import check_metadata
from brain.rules.names import MAX_SESSION_ID, check_id
from brain.rules.submits import session_key
from protocol import SchemaError, loads
from protocol.storable import unstorable


class NotSupported(SchemaError):
    """A LangGraph feature that does not map onto Tendon (a graph's internals): refused, named."""

    code = "not_supported"


async def caller(request: Request) -> Caller:
    """The caller of ``Authorization: Bearer TOKEN``, or of LangGraph's ``x-api-key: TOKEN``."""
    api: Api = request.app.state.api
    said = request.headers.get("authorization")
    key = request.headers.get("x-api-key")
    if not said and key:
        said = f"Bearer {key}"
    return api.tokens.caller(said)


CallerDep = Annotated[Caller, Depends(caller)]


def api_of(request: Request) -> Api:
    return request.app.state.api  # type: ignore[no-any-return]


async def body_of(request: Request, model: type[BaseModel] = Loose) -> dict[str, Any]:
    """A request's JSON object (the one strict codec; an empty body is ``{}``), checked by
    ``model`` (a field of the wrong type is a 422 naming it): the fields it was given."""
    raw = await request.body()
    kind = request.headers.get("content-type", JSON).partition(";")[0].strip().lower()
    if raw.strip() and kind != JSON:
        raise SchemaError(f"a body is JSON (Content-Type: {JSON}), not {kind[:60]!r}")
    found = loads(raw) if raw.strip() else {}
    if not isinstance(found, dict):
        raise SchemaError("the body must be a JSON object")
    problem = unstorable(found)
    if problem is not None:  # a NUL or a lone surrogate anywhere: no store keeps it
        raise SchemaError(f"the body cannot be stored: its text {problem}")
    return parsed(model, found).model_dump(exclude_unset=True)


def documented(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI entry of a route that reads its own body (``body_of``), required there."""
    return {"requestBody": {"required": True, "content": {JSON: {"schema": inlined(model)}}}}


def refuse(body: dict[str, Any], fields: dict[str, str]) -> None:
    """NotSupported for the first field of ``body`` (given, not null or empty) that ``fields``
    names, with why."""
    for name, why in fields.items():
        if body.get(name) not in (None, False, [], {}, ""):
            raise NotSupported(f"`{name}` is not supported by Tendon's LangGraph API: {why}")


GRAPH_INTERNALS = {
    "interrupt_before": "Tendon's agents have no graph nodes to stop at; a tool in the agent's `approvals` "
    "waits for a person instead (an interrupt answered with command.resume)",
    "interrupt_after": "Tendon's agents have no graph nodes to stop at",
    "checkpoint": "Tendon resumes from its journal, not from a checkpoint a client names",
    "checkpoint_id": "Tendon resumes from its journal, not from a checkpoint a client names",
    "webhook": "a cron's runs take no webhook yet (a run's does): follow the thread's stream",
    "stream_subgraphs": "Tendon's agents have no subgraphs",
    "feedback_keys": "LangSmith feedback is not part of Tendon",
}


def thread_key(namespace: str, thread_id: str) -> str:
    """The store's key of the session a LangGraph thread is (its runs go to its main thread)."""
    check_id("thread id", thread_id, MAX_SESSION_ID)
    return session_key(namespace, thread_id)


def metadata_of(pairs: Any, what: str = "metadata") -> dict[str, str]:
    """A thread's metadata as Tendon keeps a session's: string pairs (another value is refused,
    named, rather than kept as something else)."""
    if pairs is None:
        return {}
    if not isinstance(pairs, dict):
        raise SchemaError(f"{what} must be an object of string values")
    for key, value in pairs.items():
        if not isinstance(value, str):
            raise NotSupported(
                f"{what} {key}: Tendon keeps a thread's metadata as string pairs, not {type(value).__name__}"
            )
    return check_metadata(pairs, what)


def when(value: Any) -> str | None:
    """A time as LangGraph's clients read it (ISO 8601, UTC)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return str(value.isoformat())


def page(items: list[Any], body: dict[str, Any]) -> list[Any]:
    """``limit`` items after ``offset`` (LangGraph's search paging)."""
    limit, offset = body.get("limit", 10), body.get("offset", 0)
    if not isinstance(limit, int) or not isinstance(offset, int) or limit < 1 or offset < 0:
        raise SchemaError("limit must be a positive integer and offset one of at least 0")
    return items[offset : offset + min(limit, 1000)]


def matches(metadata: dict[str, Any], wanted: Any) -> bool:
    """Whether ``metadata`` holds every pair of ``wanted`` (LangGraph's metadata filter)."""
    if wanted is None:
        return True
    if not isinstance(wanted, dict):
        raise SchemaError("a metadata filter must be an object")
    return all(metadata.get(k) == v for k, v in wanted.items())
