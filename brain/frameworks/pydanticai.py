"""Pydantic AI agents run durably: the agent's own loop, its model and tools behind a replay.

For each run of a turn, the agent (``module:attribute`` of the definition) runs with two things
swapped in by ``Agent.override`` (per task: concurrent turns of one agent do not see each other's):

- :class:`TendonModel`, a ``WrapperModel`` around the agent's own model, answers request k from
  the turn's k-th committed reply, or streams the real model and commits its reply first;
- :class:`TendonToolset` wraps every toolset of the agent: a tool the definition routes to the
  Hands (``tools``) returns its committed outcome, a ``local_tools`` one runs here. A tool the
  framework flags ``requires_approval`` waits for a person through Tendon's approvals instead of
  Pydantic AI's deferred tools (so it is answered with ``brain respond``, owned by the server).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.exceptions import ModelHTTPError, UnexpectedModelBehavior
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    PartDeltaEvent,
    PartStartEvent,
    SystemPromptPart,
    TextPart,
    TextPartDelta,
    ToolCallPart,
    ToolCallPartDelta,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestParameters, StreamedResponse
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.toolsets import CombinedToolset
from pydantic_ai.toolsets.wrapper import WrapperToolset
from pydantic_core import to_jsonable_python

from brain.frameworks.replay import Call, Live, Replay, tool_value
from brain.models.base import Delta, Message, OnDelta
from brain.models.openai_chat import RETRYABLE_STATUS, classify
from brain.rules import foreign
from protocol import ModelError, SchemaError


class TendonModel(WrapperModel):
    """The agent's model behind the turn's journal (see the module's docstring)."""

    def __init__(self, wrapped: Any, replay: Replay) -> None:
        super().__init__(wrapped)
        self.replay = replay

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        asked = foreign.asked(_asked(messages, model_request_parameters))

        async def live(sink: OnDelta | None) -> Live:
            try:
                return await self._streamed(messages, model_settings, model_request_parameters, sink)
            except (ModelError, SchemaError):
                raise
            except Exception as exc:
                raise _classified(exc) from exc

        kept = await self.replay.ask(asked, live)
        return ModelMessagesTypeAdapter.validate_python([kept])[0]  # type: ignore[return-value]

    @asynccontextmanager
    async def request_stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[StreamedResponse]:
        raise SchemaError(
            "a Tendon run of a Pydantic AI agent asks its model through request(), not a stream"
        )
        yield  # pragma: no cover - an async generator

    async def _streamed(
        self,
        messages: list[ModelMessage],
        settings: ModelSettings | None,
        params: ModelRequestParameters,
        sink: OnDelta | None,
    ) -> Live:
        added = [
            SystemPromptPart(content=str(m.content.get("text", "")))
            if m.role == "steer"
            else UserPromptPart(content=str(m.content.get("text", "")))
            for m in self.replay.added
        ]
        if added:  # steered or injected: the model reads it after the framework's messages
            messages = [*messages, ModelRequest(parts=added)]
        async with self.wrapped.request_stream(messages, settings, params) as stream:
            async for event in stream:
                if sink is not None:
                    _preview(event, sink)
                    await asyncio.sleep(0)  # the streams passing pieces on send each one now
            response = stream.get()
        output_tools = {t.name for t in params.output_tools}
        calls = [
            _call(p)
            for p in response.parts
            if isinstance(p, ToolCallPart) and p.tool_name not in output_tools
        ]
        text = "".join(p.content for p in response.parts if isinstance(p, TextPart)) or None
        kept = ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]
        usage = foreign.usage_of(response.usage.input_tokens, response.usage.output_tokens)
        return Live(kept, text, calls, usage, response.model_name)


@dataclasses.dataclass
class TendonToolset(WrapperToolset[Any]):
    """Every toolset of the agent, its calls answered from the journal (see the module's docstring).
    A dataclass, as the framework copies its toolsets with ``dataclasses.replace``."""

    replay: Replay = dataclasses.field(kw_only=True)

    async def get_tools(self, ctx: Any) -> dict[str, Any]:
        tools = await self.wrapped.get_tools(ctx)
        agent = self.replay.agent
        error = foreign.unplaced_tools(agent.name, tools, agent.tools, agent.local_tools)
        if error is not None:
            raise error
        flagged = {name for name, t in tools.items() if t.tool_def.kind == "unapproved"}
        self.replay.approvals = sorted(set(self.replay.approvals) | flagged)
        # Approval is Tendon's (an intent pending approval): the framework calls the tool as any other.
        return {
            name: dataclasses.replace(t, tool_def=dataclasses.replace(t.tool_def, kind="function"))
            if name in flagged
            else t
            for name, t in tools.items()
        }

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any, tool: Any) -> Any:
        if name in self.replay.agent.tools:
            return tool_value(self.replay.outcome(ctx.tool_call_id, name))
        return await self.wrapped.call_tool(name, tool_args, ctx, tool)


async def run_turn(replay: Replay, agent: Agent[Any, Any]) -> Any:
    """Run the agent's loop over the turn's journal; its output, once it has one (a
    :class:`~brain.frameworks.replay.Suspended` when the turn goes on in a later run)."""
    if not isinstance(agent, Agent):
        raise SchemaError(f"{replay.agent.agent} is not a Pydantic AI Agent but a {type(agent).__name__}")
    if agent.model is None:
        raise SchemaError(
            f"agent {replay.agent.name}: give the Pydantic AI agent a model of its own, which the Brain asks"
        )
    model = TendonModel(agent.model, replay)
    toolset = TendonToolset(CombinedToolset(list(agent.toolsets)), replay=replay)
    with agent.override(model=model, toolsets=[toolset], tools=[]):
        try:
            result = await agent.run(replay.prompt, message_history=history_of(replay.prior) or None)
        except UnexpectedModelBehavior as exc:  # the agent's own limits (output retries, say)
            raise ModelError(f"the agent gave up on the model's replies: {exc}", retryable=False) from exc
    return result.output


def history_of(prior: list[Message]) -> list[ModelMessage]:
    """The thread's earlier turns as Pydantic AI messages: each reply as the framework made it,
    with only its Hands tool calls (whose outcomes the thread keeps) and their returns."""
    out: list[ModelMessage] = []
    names: dict[str, tuple[str, str]] = {}  # Tendon call id -> (tool, the framework's call id)
    returns: list[Any] = []
    for m in prior:
        if m.role == "tool" and m.content.get("call_id") in names:
            tool, framework_id = names[m.content["call_id"]]
            returns.append(
                ToolReturnPart(tool_name=tool, content=tool_value(m.content), tool_call_id=framework_id)
            )
            continue
        if returns:
            out.append(ModelRequest(parts=returns))
            returns = []
        if m.role in ("user", "steer"):
            out.append(ModelRequest(parts=[UserPromptPart(content=str(m.content.get("text", "")))]))
        elif m.role == "assistant":
            response = _prior_reply(m.content, names)
            if response is not None:
                out.append(response)
    if returns:
        out.append(ModelRequest(parts=returns))
    return out


def _prior_reply(content: dict[str, Any], names: dict[str, tuple[str, str]]) -> ModelResponse | None:
    kept = content.get(foreign.FRAMEWORK_KEY)
    if kept is None or kept.get("name") != "pydantic-ai":
        return ModelResponse(parts=[TextPart(content=content["text"])]) if content.get("text") else None
    response = ModelMessagesTypeAdapter.validate_python([kept["response"]])[0]
    assert isinstance(response, ModelResponse)
    calls = kept.get("calls") or {}
    for framework_id, call_id in calls.items():
        tool = next((c["tool"] for c in content.get("tool_calls") or [] if c["call_id"] == call_id), "")
        names[call_id] = (tool, framework_id)
    ours = set(calls)
    parts = [
        p
        for p in response.parts
        if isinstance(p, TextPart) or (isinstance(p, ToolCallPart) and p.tool_call_id in ours)
    ]
    return ModelResponse(parts=parts, usage=response.usage, model_name=response.model_name) if parts else None


def _asked(messages: list[ModelMessage], params: ModelRequestParameters) -> Any:
    """What a request asks, for its digest: each message's parts (kind, text, tool, arguments,
    call id) and instructions, and the tools offered; not the times and run ids a new run makes."""
    shown = []
    for message in messages:
        parts = []
        for part in message.parts:
            fields = {
                k: getattr(part, k)
                for k in ("content", "tool_name", "args", "tool_call_id")
                if hasattr(part, k)
            }
            parts.append({"kind": getattr(part, "part_kind", type(part).__name__), **fields})
        shown.append(
            {"kind": message.kind, "parts": parts, "instructions": getattr(message, "instructions", None)}
        )
    tools = sorted(t.name for t in [*params.function_tools, *params.output_tools])
    return to_jsonable_python({"messages": shown, "tools": tools}, fallback=repr)


def _call(part: ToolCallPart) -> Call:
    try:
        args = part.args_as_dict()
    except ValueError as exc:
        return Call(part.tool_call_id, part.tool_name, None, f"the arguments are not valid JSON: {exc}")
    if not isinstance(args, dict):
        return Call(part.tool_call_id, part.tool_name, None, "the arguments must be a JSON object")
    return Call(part.tool_call_id, part.tool_name, json.loads(json.dumps(args, default=str)))


def _preview(event: Any, sink: OnDelta) -> None:
    """A streamed piece of the reply, for the live previews."""
    if isinstance(event, PartStartEvent):
        part = event.part
        if isinstance(part, TextPart) and part.content:
            sink(Delta(kind="text", text=part.content))
        elif isinstance(part, ToolCallPart) and isinstance(part.args, str) and part.args:
            sink(Delta(kind="tool_args", text=part.args, call_id=part.tool_call_id, tool=part.tool_name))
    elif isinstance(event, PartDeltaEvent):
        delta = event.delta
        if isinstance(delta, TextPartDelta) and delta.content_delta:
            sink(Delta(kind="text", text=delta.content_delta))
        elif isinstance(delta, ToolCallPartDelta) and isinstance(delta.args_delta, str) and delta.args_delta:
            sink(Delta(kind="tool_args", text=delta.args_delta, call_id=delta.tool_call_id))


def _classified(exc: Exception) -> ModelError:
    """What a failed model call of the framework means for the turn's retry policy."""
    if isinstance(exc, ModelHTTPError):
        status = exc.status_code
        retryable = status in RETRYABLE_STATUS or status >= 500
        return ModelError(f"the model API answered {status}: {exc}", retryable=retryable)
    cause = exc.__cause__
    if isinstance(cause, Exception):
        try:
            return classify(cause)
        except Exception:  # noqa: BLE001 - not an error of the API's client
            pass
    if isinstance(exc, UnexpectedModelBehavior):
        return ModelError(f"the model answered what the agent cannot use: {exc}", retryable=False)
    return classify(exc)
