"""The HTTP API's bodies: what requests carry and what answers say (the OpenAPI document is made
from these)."""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from brain.rules.agents import AgentDefinition
from brain.rules.names import LookupId, RequestId

M = TypeVar("M", bound=BaseModel)
JSON = "application/json"

# What the record's integer columns hold: a larger number in a request is refused (422).
INT32 = 2**31 - 1
INT64 = 2**63 - 1


class ErrorDetail(BaseModel):
    code: str = Field(description="a stable code: not_found, conflict, schema_error, gone, unauthorized...")
    message: str


class ErrorBody(BaseModel):
    """Every error answer."""

    error: ErrorDetail


class SubmitRequest(BaseModel):
    """A turn to accept. The same request id with the same input answers the same turn."""

    model_config = ConfigDict(extra="forbid")

    request_id: RequestId = Field(description="idempotency key, per session")
    input: str = Field(description="the user's input")
    agent: AgentDefinition = Field(description="the agent definition (a thread is pinned to its version)")
    thread: str = Field(default="main", description="the session's thread (created on first use)")
    metadata: dict[str, str] | None = Field(
        default=None,
        description="string pairs set on the session (at most 32; the sessions list searches them)",
    )
    thread_metadata: dict[str, str] | None = Field(default=None, description="string pairs set on the thread")
    expect_tools: bool = Field(
        default=False,
        description="take the agent's tools that no Hands pool has announced yet (a pool that starts "
        "later): without it, such a submit is refused (400, `unknown_tool`)",
    )
    multitask_strategy: Literal["reject", "enqueue", "interrupt", "rollback"] = Field(
        default="enqueue",
        description="what to do when the thread has an unfinished turn: refuse (409), queue behind it, "
        "cancel it keeping its work in the history (interrupt), or cancel it and drop its work from the "
        "history (rollback); a known request id answers its turn whatever this says",
    )


class Submitted(BaseModel):
    turn_id: str
    created: bool = Field(description="false when the request id had made this turn already")
    turn: dict[str, Any] | None = Field(
        default=None,
        description="with `wait`: the turn as it stands once it ended or the wait ran out (as `GET "
        "/v1/turns/{turn_id}` answers it); without `wait`, absent",
    )
    warnings: list[str] | None = Field(
        default=None,
        description="why some of the agent's tools would not run now (a pool expected later, a route "
        "nobody serves right now: the turn waits for one), one sentence each; absent when none",
    )


class ControlRequest(BaseModel):
    """A control on a turn: its receipt says whether it was received, applied or rejected."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["steer", "inject", "withdraw", "pause", "resume", "cancel"]
    request_id: RequestId | None = Field(default=None, description="idempotency key")
    text: str | None = Field(default=None, description="steer, inject: the input to add")
    revision: int | None = Field(
        default=None, ge=0, le=INT32, description="resume: the turn's revision the caller saw"
    )
    control_id: int | None = Field(
        default=None, ge=1, le=INT64, description="withdraw: the steer or inject to take back"
    )


class RespondRequest(BaseModel):
    """A person's answer to a call that waits for one."""

    model_config = ConfigDict(extra="forbid")

    call: LookupId = Field(description="the call id (or execution id)")
    decision: Literal["approve", "deny", "result"]
    request_id: RequestId | None = Field(default=None, description="idempotency key")
    result: Any = Field(default=None, description="result: the manual tool's outcome (JSON)")
    reason: str | None = Field(default=None, description="deny: why (the model is told)")


class SignalRequest(BaseModel):
    """A signal for a turn's call that waits for it (the built-in ``wait_for_signal``)."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(
        min_length=3, max_length=200, pattern=r"^x\.\S+$", description="the signal's key (under `x.`)"
    )
    payload: Any = Field(default=None, description="what the waiting call gets as its result (any JSON)")
    request_id: str | None = Field(default=None, min_length=1, max_length=200)


class Receipt(BaseModel):
    control_id: int
    turn_id: str
    kind: str
    request_id: str
    status: Literal["received", "applied", "rejected", "withdrawn"]
    reason: str | None


class ReconcileRequest(BaseModel):
    """An operator's resolution of an UNKNOWN execution, with evidence (audited by the Hands of its
    route): exactly one of ``result`` and ``failure``."""

    model_config = ConfigDict(extra="forbid")

    evidence: str = Field(min_length=1, description="how you know what happened")
    actor: str = Field(min_length=1, description="who vouches for it")
    result: Any = Field(
        default=None, description="what the operation returned, for a success (any JSON, null included)"
    )
    failure: str | None = Field(default=None, min_length=1, description="what went wrong, for a failure")
    request_id: RequestId | None = Field(
        default=None,
        description="idempotency key (per turn, like every control's): the same request again answers "
        "the same, and is carried out once; without one, each request is a new one",
    )  # fmt: skip

    def outcome(self) -> dict[str, Any]:
        """``result`` and ``failure`` as given (both, one or neither: the control's body decides)."""
        return {name: getattr(self, name) for name in ("result", "failure") if name in self.model_fields_set}


class Reconciled(BaseModel):
    """Where an operator's reconcile stands, as the Brain's record says."""

    execution_id: str
    turn_id: str
    route: str = Field(description="the route whose Hands carry it out")
    request_id: str
    status: str = Field(
        description="the execution's status once it left UNKNOWN (`succeeded` or `failed`); `requested` "
        "while no worker of the route has carried the reconcile out (202)"
    )
    how: str | None = Field(default=None, description="`reconciled` (by this or an earlier reconcile)")
    evidence: str | None = None
    message: str | None = Field(default=None, description="with 202: what the reconcile waits for")


class EventPage(BaseModel):
    events: list[dict[str, Any]]
    cursor: int = Field(description="ask from here next (past every entry looked at)")


def parsed(model: type[M], body: Any) -> M:
    """A request's body (decoded by the strict codec: ``brain.api.guard.StrictRequest``) read as
    ``model`` by a route that reads its own (the submit): a body that is not one is refused as a
    declared body is, with the error's place under ``body``."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None


def inlined(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON Schema with its definitions written in place, for the OpenAPI entry of a
    route that reads its own body: FastAPI adds to the document's components only the models of
    declared bodies and answers, so a reference to another would point at nothing."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def resolve(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [resolve(item, seen) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            if name in seen:
                raise TypeError(f"{model.__name__} refers to itself through {name}: it cannot be inlined")
            return resolve(definitions[name], (*seen, name))
        return {key: resolve(value, seen) for key, value in node.items()}

    return resolve(schema, ())  # type: ignore[no-any-return]
