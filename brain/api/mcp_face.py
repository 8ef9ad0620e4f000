"""Tendon agents as MCP tools: with ``TENDON_MCP_AGENTS`` (agent definition files), the Brain's HTTP
API also answers MCP at ``/mcp`` (Streamable HTTP, the official SDK's server side, stateless).

Each agent is a tool named after it: its ``input`` becomes a durable turn of the agent (in the
session ``session``, default ``mcp``), and the call answers with the turn's result once it ended.
The bearer token decides the namespace, as for the rest of the API. The turn's request id is the
call's ``request_id`` argument, else the operation id a Tendon pool sends in ``_meta`` (so a
Tendon agent calling another through MCP never starts its turn twice), else a new one. A call
that outlasts ``ANSWER_WAIT`` answers with the turn's id and status; the turn goes on.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcp.server.mcpserver import Context  # the tools' annotations name it: this module needs the extra
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from brain import verbs
from brain.rules.agents import AgentDefinition
from brain.verbs.describe import describe
from protocol import SchemaError, TendonError, new_id

if TYPE_CHECKING:
    from brain.api.app import Api

ANSWER_WAIT = 600.0  # seconds a call waits for its turn to end before it answers with its status
OPERATION_META = "io.tendon/operation_id"
_NAMESPACE: ContextVar[str] = ContextVar("mcp_namespace")


def current_namespace() -> str:
    """The namespace of the MCP request being handled (its bearer token's)."""
    return _NAMESPACE.get()


def load_agents(spec: str) -> list[AgentDefinition]:
    """The agent definitions of ``TENDON_MCP_AGENTS`` (JSON files, separated by commas)."""
    agents = []
    for path in filter(None, (p.strip() for p in spec.split(","))):
        try:
            agents.append(AgentDefinition.model_validate_json(Path(path).read_text()))
        except (OSError, ValueError) as exc:
            raise SchemaError(f"TENDON_MCP_AGENTS: {path} is not an agent definition: {exc}") from exc
    return agents


def tool_name(agent: AgentDefinition) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", agent.name)


class McpFace:
    """The MCP server of one Brain's API: a tool per agent, a route at /mcp."""

    def __init__(self, api: Api, agents: list[AgentDefinition]) -> None:
        from mcp.server.mcpserver import MCPServer
        from mcp.server.transport_security import TransportSecuritySettings

        self.api = api
        from brain.api.mcp_tasks import TurnTasks

        self.agents = {tool_name(agent): agent for agent in agents}
        self.server = MCPServer(
            "tendon",
            instructions="Each tool runs a Tendon agent's durable turn.",
            extensions=[TurnTasks(self)],
        )
        for agent in agents:
            self.server.add_tool(
                self._tool(agent), name=tool_name(agent), description=agent.instructions or agent.name
            )
        # Auth is by bearer token; only a development API (no token) keeps the SDK's guard against
        # DNS rebinding (loopback names only), which matters for a server any browser can reach
        # unauthenticated.
        loopback = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
        guard = TransportSecuritySettings(
            enable_dns_rebinding_protection=api.tokens.open,
            allowed_hosts=loopback,
            allowed_origins=[f"http://{host}" for host in loopback],
        )
        app = self.server.streamable_http_app(
            streamable_http_path="/mcp", stateless_http=True, json_response=True, transport_security=guard
        )
        self._inner: Any = getattr(app.routes[0], "app")  # noqa: B009 - the route's ASGI app

    def route(self) -> Route:
        return Route("/mcp", endpoint=self, methods=["GET", "POST", "DELETE"])  # an ASGI app: self

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.server.session_manager.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            namespace = self.api.tokens.caller(headers.get("authorization")).tenant()
        except TendonError as exc:  # as the rest of the API answers it
            from brain.api.app import status_of

            body = json.dumps({"error": {"code": exc.code, "message": exc.message}}).encode()
            status = status_of(exc)
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json")]})  # fmt: skip
            await send({"type": "http.response.body", "body": body})
            return
        token = _NAMESPACE.set(namespace)
        try:
            await self._inner(scope, receive, send)
        finally:
            _NAMESPACE.reset(token)

    async def submit(
        self, agent: AgentDefinition, args: dict[str, Any], meta: Mapping[str, Any]
    ) -> tuple[str, bool]:
        """Submit the turn a call asks for (in the caller's namespace): its id, and whether it is new."""
        request_id = str(args.get("request_id") or "") or str(meta.get(OPERATION_META) or "") or new_id()
        api = self.api
        return await verbs.submit(
            api.store, namespace=_NAMESPACE.get(), session_id=str(args.get("session") or "mcp"),
            request_id=request_id, user_input=str(args.get("input", "")), agent=agent,
            wake_channel=api.wake_channel, thread="main", served=api.served, follow_edits=api.edits,
            tools=api.tools,
        )  # fmt: skip

    async def turn(self, turn_id: str) -> dict[str, Any]:
        """The turn as the caller's namespace sees it (NotFoundError in any other)."""
        return await describe(self.api.store, _NAMESPACE.get(), turn_id)

    def _tool(self, agent: AgentDefinition) -> Any:
        from mcp.server.mcpserver.exceptions import ToolError

        from brain.api.routes import until_ended

        async def run_agent(
            input: str, ctx: Context, session: str = "mcp", request_id: str = ""
        ) -> dict[str, Any]:
            args = {"input": input, "session": session, "request_id": request_id}
            turn_id, created = await self.submit(agent, args, ctx.request_context.meta or {})
            await until_ended(self.api, _NAMESPACE.get(), turn_id, ANSWER_WAIT, look=not created)
            turn = await self.turn(turn_id)
            if turn["status"] in ("failed", "cancelled"):
                raise ToolError(f"turn {turn_id} {turn['status']}: {json.dumps(turn.get('error'))}")
            return answer_of(turn)

        return run_agent


def answer_of(turn: dict[str, Any]) -> dict[str, Any]:
    """What a call answers of its turn."""
    return {"turn_id": turn["turn_id"], "request_id": turn.get("request_id"), "status": turn["status"],
            "result": turn.get("result")}  # fmt: skip
