"""The HTTP API as an ASGI app (FastAPI): one set of verbs (``brain.verbs``: sessions, controls,
observe) behind routes that check whose namespace a request acts in, with every error
a structured body (``{"error": {"code", "message"}}``) and a status that says what kind it is:
Tendon's own errors, FastAPI's validation errors, an unknown route (404) or method (405), a body
over the size limit (413, ``brain.api.guard``) alike.

Leases, commits and the Hands' ledger are not reachable from here; the operator routes (reconcile,
which goes to the Hands as a control, UNKNOWN executions, parked messages, routes and their
workers) need an operator token.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from brain.api.auth import Caller, Tokens
from brain.api.guard import DEFAULT_MAX_REQUEST_BYTES, BodyLimit
from brain.rules.names import shown
from brain.rules.submits import Submit
from brain.run.endings import Endings
from brain.run.metrics import BrainMetrics
from brain.run.previews import Previews
from brain.store import BrainStore, Control
from brain.verbs.tools import KnownTools
from infra.db import is_transient
from infra.objects.payloads import PayloadCodec
from infra.process.logging import get_logger
from infra.transport import Topology, Transport
from protocol import (
    AuthError,
    ConflictError,
    ForbiddenError,
    GoneError,
    IllegalTransitionError,
    LimitReachedError,
    NotFoundError,
    ProtocolError,
    TendonError,
    TooLargeError,
)

log = get_logger(__name__)

STATUS: list[tuple[type[TendonError], int]] = [
    (AuthError, 401),
    (ForbiddenError, 403),
    (NotFoundError, 404),
    (ConflictError, 409),
    (IllegalTransitionError, 409),
    (LimitReachedError, 409),
    (GoneError, 410),
    (TooLargeError, 413),
    (ProtocolError, 422),
]

# The codes of the errors FastAPI and Starlette raise themselves (an unknown route, a method a
# route does not take...), by status.
HTTP_CODES = {
    400: "bad_request",
    401: AuthError.code,
    403: ForbiddenError.code,
    404: NotFoundError.code,
    405: "method_not_allowed",
    413: TooLargeError.code,
}


def status_of(exc: TendonError) -> int:
    """The HTTP status of an error: what kind of problem it is, or 503 for a passing fault."""
    for kind, status in STATUS:
        if isinstance(exc, kind):
            return status
    return 503 if exc.retryable else 400


@dataclass
class Api:
    """What the routes use: the store, who may call, where controls and previews go."""

    store: BrainStore
    tokens: Tokens
    topology: Topology
    wake_channel: str
    previews: Previews = field(default_factory=Previews)
    endings: Endings = field(default_factory=Endings)  # wakes a wait for a turn that ends here
    metrics: BrainMetrics = field(default_factory=BrainMetrics)
    # Hands committed controls (an operator's reconcile) to this Brain's control relay, to be
    # published at once (None: the relay's sweep of the outbox finds them).
    controls: Callable[[list[Control]], None] | None = None
    # Packs a control whose body is big (an operator's reconcile) by reference (None: inline).
    codec: PayloadCodec | None = None
    # This Brain's own submit, which may start a turn's run in the submit's commit (None: a plain
    # submit, the turn claimed by whichever Brain looks first).
    served: Callable[[Submit], Awaitable[tuple[str, bool]]] | None = None
    # The Brain's transport: who consumes each route's commands now (None: not known here).
    transport: Transport | None = None
    # The tools a submit may name, and which routes were seen served (``brain.verbs.tools``).
    tools: KnownTools = field(default_factory=KnownTools)
    # A local development server's (else None): submits follow edited agents (their versions from
    # their content, a thread with nothing unfinished moves to the edit), and the Brain is told
    # which thread moved.
    edits: Callable[[str], None] | None = None
    # The agents served as MCP tools at /mcp (``TENDON_MCP_AGENTS``; brain.api.mcp_face).
    mcp_agents: list[Any] = field(default_factory=list)
    poll: float = 0.25  # seconds between looks at the journal while a stream is idle
    # Seconds between looks at a waited-for turn that does not end here (another Brain runs it).
    wait_poll: float = 0.2
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # a bigger request body is refused (413)
    webhook_private: bool = False  # a LangGraph webhook may name a loopback or private address

    def ended(self, turn_id: str, status: str, created_at: datetime) -> None:
        """A request ended a turn in its own commit (a cancel with nothing running): its waiters
        hear it now, and it is measured like a turn that ended in a run."""
        self.endings.ended(turn_id)
        self.metrics.turn_ended(status, created_at)


async def caller_of(request: Request) -> Caller:
    # async, though it awaits nothing: FastAPI runs a plain function dependency in a worker
    # thread, a hand-over to another thread and back on every request.
    api: Api = request.app.state.api
    return api.tokens.caller(request.headers.get("authorization"))


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def create_app(api: Api) -> FastAPI:
    from brain.api import agui, console, forks, langgraph, operator, routes, schedules, stream

    app = FastAPI(
        title="Tendon",
        version="1",
        description="Durable agent turns: submit, observe, steer. Every error is "
        '`{"error": {"code", "message"}}`; auth is `Authorization: Bearer TOKEN`. A request body is '
        f"strict JSON of at most {api.max_request_bytes:,} bytes (`TENDON_MAX_REQUEST_BYTES`; else 413).",
    )
    app.state.api = api
    app.add_middleware(BodyLimit, limit=api.max_request_bytes)

    @app.exception_handler(TendonError)
    async def tendon_error(request: Request, exc: TendonError) -> JSONResponse:
        return JSONResponse(error_body(exc.code, exc.message), status_code=status_of(exc))

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()))
        message = f"{where[:200]}: {first.get('msg')}"
        return JSONResponse(error_body("schema_error", message), status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # FastAPI answers an error of ours met while it read a body as its own 400: ours it is.
        if isinstance(exc.__cause__, TendonError):
            return await tendon_error(request, exc.__cause__)
        path = shown(request.url.path)
        said = {404: f"there is no route {path}", 405: f"{request.method} is not allowed on {path}"}
        message = said.get(exc.status_code, str(exc.detail))
        code = HTTP_CODES.get(exc.status_code, "http_error")
        return JSONResponse(error_body(code, message), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        if is_transient(exc):  # a passing database fault that no layer below said in its words
            log.warning("api_request_unavailable", path=request.url.path, error=repr(exc))
            message = f"the database is unavailable for now: {type(exc).__name__}"
            return JSONResponse(error_body("transient", message), status_code=503)
        log.exception("api_request_failed", path=request.url.path)
        return JSONResponse(error_body("internal_error", f"{type(exc).__name__}"), status_code=500)

    app.include_router(routes.router)
    app.include_router(schedules.router)
    app.include_router(forks.router)
    app.include_router(stream.router)
    app.include_router(agui.router)
    for part in langgraph.ROUTERS:
        app.include_router(part)
    app.include_router(operator.router)
    app.include_router(operator.metrics)
    app.include_router(console.router)
    if api.mcp_agents:
        from brain.api.mcp_face import McpFace

        app.state.mcp = McpFace(api, api.mcp_agents)
        app.router.routes.append(app.state.mcp.route())
    return app
