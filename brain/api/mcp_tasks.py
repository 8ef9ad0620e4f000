"""A long turn as an MCP task (the Tasks extension ``io.modelcontextprotocol/tasks``, revision
2026-07-28), for a client that advertises it: the ``tools/call`` of an agent answers at once with a
task whose id is the turn's id, so the task is as durable as the turn; ``tasks/get`` reads the
turn (in the caller's namespace), ``tasks/cancel`` sends the turn a cancel control."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from mcp.server.extension import Extension, MethodBinding
from mcp_types import RequestParams
from pydantic import ConfigDict, Field

from brain.verbs import controls
from protocol import new_id

if TYPE_CHECKING:
    from brain.api.mcp_face import McpFace

IDENTIFIER = "io.modelcontextprotocol/tasks"
POLL_MS = 500
ENDED = {"completed": "completed", "failed": "completed", "cancelled": "cancelled"}


class TaskParams(RequestParams):
    model_config = ConfigDict(populate_by_name=True)
    task_id: str = Field(alias="taskId")


def _time(value: Any) -> str:
    return value.isoformat() if isinstance(value, datetime) else datetime.now(UTC).isoformat()


def task_of(turn: dict[str, Any]) -> dict[str, Any]:
    """The task a turn is: working until it ended; a failed turn is a completed task whose
    result is an error (the task's ``failed`` is kept for JSON-RPC errors)."""
    from brain.api.mcp_face import answer_of

    status = ENDED.get(turn["status"], "working")
    task: dict[str, Any] = {
        "taskId": turn["turn_id"], "status": status, "createdAt": _time(turn.get("created_at")),
        "lastUpdatedAt": datetime.now(UTC).isoformat(), "ttlMs": None, "pollIntervalMs": POLL_MS,
    }  # fmt: skip
    if turn.get("waiting_for"):
        task["statusMessage"] = f"the turn waits for {turn['waiting_for']}"
    if status == "completed":
        answer = answer_of(turn)
        failed = turn["status"] == "failed"
        text = json.dumps(turn.get("error") if failed else answer, default=str)
        task["result"] = {"content": [{"type": "text", "text": text}], "isError": failed}
        if not failed:
            task["result"]["structuredContent"] = json.loads(json.dumps(answer, default=str))
    return task


class TurnTasks(Extension):
    identifier = IDENTIFIER

    def __init__(self, face: McpFace) -> None:
        self.face = face

    def methods(self) -> list[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskParams, self.get),
            MethodBinding("tasks/cancel", TaskParams, self.cancel),
        ]

    async def intercept_tool_call(self, params: Any, ctx: Any, call_next: Any) -> Any:
        meta = params.meta or {}
        capabilities = meta.get("io.modelcontextprotocol/clientCapabilities") or {}
        agent = self.face.agents.get(params.name)
        if agent is None or IDENTIFIER not in (capabilities.get("extensions") or {}):
            return await call_next(ctx)
        turn_id, _ = await self.face.submit(agent, dict(params.arguments or {}), meta)
        return {"resultType": "task", **task_of(await self.face.turn(turn_id))}

    async def get(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        return {"resultType": "complete", **task_of(await self.face.turn(params.task_id))}

    async def cancel(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        from brain.api.mcp_face import current_namespace

        api = self.face.api
        await controls.control(
            api.store, namespace=current_namespace(), turn_id=params.task_id, request_id=new_id(),
            kind=controls.Kind("cancel"), topology=api.topology, wake_channel=api.wake_channel,
            ended=api.ended, send=api.controls,
        )  # fmt: skip
        return {}
