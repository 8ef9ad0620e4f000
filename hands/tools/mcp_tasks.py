"""The MCP Tasks extension (``io.modelcontextprotocol/tasks``, revision 2026-07-28), client side.

The pool advertises the extension on every connection; a server may then answer a ``tools/call``
with a task (``resultType: "task"``: a task id it created durably) instead of a result. The SDK
(2.3) carries extensions but implements no Tasks of its own, so this module gives it the wire
shapes: the claim of a ``"task"`` result (whose resolver hands the task to the caller by raising
:class:`TaskCreated`, so the caller commits the task id before it waits), ``tasks/get``,
``tasks/cancel`` and ``tasks/update`` (the answers to a task in ``input_required``: its
``inputRequests`` answered by ``inputResponses`` with the same keys, in the Multi Round-Trip
shapes: an elicitation is answered by ``{"action": "accept", "content": ...}`` or
``{"action": "decline"}``). Imported only where the ``mcp`` extra is installed.
"""

from __future__ import annotations

from typing import Any, Literal

from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp_types import CallToolResult, Request, RequestParams, Result
from pydantic import ConfigDict, Field

IDENTIFIER = "io.modelcontextprotocol/tasks"
TERMINAL = frozenset({"completed", "failed", "cancelled"})


class CreatedTask(Result):
    """A ``tools/call`` answered with a task handle."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    result_type: Literal["task"] = Field(default="task", alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str
    poll_interval_ms: int | None = Field(default=None, alias="pollIntervalMs")


class TaskState(Result):
    """What ``tasks/get`` says of a task: its status, and its result or error once it ended."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    task_id: str = Field(alias="taskId")
    status: str
    status_message: str | None = Field(default=None, alias="statusMessage")
    poll_interval_ms: int | None = Field(default=None, alias="pollIntervalMs")
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = Field(default=None, alias="inputRequests")


class TaskParams(RequestParams):
    model_config = ConfigDict(populate_by_name=True)
    task_id: str = Field(alias="taskId")


class UpdateTaskParams(TaskParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses")


class UpdateTask(Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateTaskParams


class GetTask(Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams


class CancelTask(Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskParams


class TaskCreated(Exception):  # noqa: N818 - not an error: how the claim hands the task over
    """Raised out of ``Client.call_tool`` by the claim's resolver: the server created a task."""

    def __init__(self, task: CreatedTask) -> None:
        super().__init__(f"task {task.task_id}")
        self.task = task


async def _hand_over(task: CreatedTask, _: ClaimContext) -> CallToolResult:
    raise TaskCreated(task)


class TasksExtension(ClientExtension):
    identifier = IDENTIFIER

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=_hand_over)]


def final_result(state: TaskState) -> CallToolResult:
    """The ``CallToolResult`` a completed task carries."""
    return CallToolResult.model_validate(state.result or {}, by_name=False)


ELICIT = "elicitation/create"


def question(state: TaskState) -> str:
    """What a task in ``input_required`` asks, in words for the person who answers."""
    asked = [
        str((r.get("params") or {}).get("message") or "")
        for r in (state.input_requests or {}).values()
        if isinstance(r, dict)
    ]
    return "; ".join(a for a in asked if a) or state.status_message or "the MCP server asks for input"


def _one(request: Any, value: Any) -> Any:
    if isinstance(request, dict) and request.get("method") == ELICIT:
        if isinstance(value, dict) and value.get("action") in ("accept", "decline", "cancel"):
            return value
        return {"action": "accept", "content": value}
    return value  # a sampling or roots request: the answer is its result as it is


def responses(requests: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The ``inputResponses`` for ``requests`` from a person's answer (``ctx.given_input``): a
    decline declines each; an answer keyed like the requests (when there are several) answers
    each by its key, else it answers every request. An elicitation's answer is its content,
    unless it is an ``{"action": ...}`` result already."""
    if given.get("decision") == "decline":
        return {key: {"action": "decline"} for key in requests}
    answer: Any = given.get("answer")
    keyed = len(requests) > 1 and isinstance(answer, dict) and set(answer) == set(requests)
    return {key: _one(request, answer[key] if keyed else answer) for key, request in requests.items()}
