"""OpenAI Agents SDK agents run durably: the SDK's own ``Runner`` loop, its model and tools behind
a replay (``brain.frameworks.replay``).

For each run of a turn the agent (``module:attribute`` of the definition) is cloned with:

- :class:`TendonModel`, an ``agents.models.interface.Model`` around the agent's own model: request
  k is answered from the turn's k-th committed reply, or the real model is streamed (its deltas
  go to the live previews) and its reply committed first;
- its function tools: one the definition routes to the Hands (``tools``) returns its committed
  outcome; a ``local_tools`` one runs here. ``needs_approval`` becomes a Tendon approval (an
  intent pending approval, answered with ``brain respond``), not the SDK's interruption.

Handoffs to other agents are refused (their models and tools would run outside the journal).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from agents import Agent, FunctionTool, RunConfig, Runner
from agents.exceptions import AgentsException, ModelBehaviorError
from agents.items import ModelResponse, TResponseOutputItem
from agents.models.interface import Model
from agents.usage import Usage
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from brain.frameworks.replay import Call, Live, Replay, tool_value
from brain.models.base import Delta, Message, OnDelta
from brain.models.openai_chat import classify
from brain.rules import foreign
from protocol import ModelError, SchemaError

_OUTPUT = TypeAdapter(list[TResponseOutputItem])
_ROLES = {"steer": "system", "user": "user"}


class TendonModel(Model):
    """The agent's model behind the turn's journal (see the module's docstring)."""

    def __init__(self, wrapped: Model, replay: Replay) -> None:
        self.wrapped = wrapped
        self.replay = replay

    async def get_response(  # type: ignore[override]
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        system, given = system_instructions, input
        args = (system_instructions, input, model_settings, tools, output_schema, handoffs, tracing)
        asked = foreign.asked(
            {
                "instructions": system,
                "input": to_jsonable_python(given, fallback=repr),
                "tools": sorted(getattr(t, "name", type(t).__name__) for t in tools),
                "output": output_schema.name() if output_schema is not None else None,
                "handoffs": sorted(h.tool_name for h in handoffs),
            }
        )

        async def live(sink: OnDelta | None) -> Live:
            try:
                return await self._streamed(args, kwargs, sink)
            except (ModelError, SchemaError):
                raise
            except ModelBehaviorError as exc:
                raise ModelError(
                    f"the model answered what the agent cannot use: {exc}", retryable=False
                ) from exc
            except Exception as exc:
                raise classify(exc) from exc

        kept = await self.replay.ask(asked, live)
        output = _OUTPUT.validate_python(kept["output"])
        usage = kept.get("usage") or {}
        return ModelResponse(
            output=output,
            usage=Usage(
                requests=1,
                input_tokens=usage.get("prompt_tokens", 0),
                output_tokens=usage.get("completion_tokens", 0),
                total_tokens=usage.get("total_tokens", 0),
            ),
            response_id=None,
        )

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise SchemaError("a Tendon run of an OpenAI Agents SDK agent asks its model without a stream")

    async def _streamed(self, args: tuple[Any, ...], kwargs: dict[str, Any], sink: OnDelta | None) -> Live:
        added = [
            {"role": _ROLES[m.role], "content": str(m.content.get("text", ""))} for m in self.replay.added
        ]
        if added:  # steered or injected: the model reads it after the framework's input
            given = [{"role": "user", "content": args[1]}] if isinstance(args[1], str) else list(args[1])
            args = (args[0], [*given, *added], *args[2:])
        completed: Any = None
        stream: Any = self.wrapped.stream_response(*args, **kwargs)
        async for event in stream:
            kind = getattr(event, "type", "")
            if kind == "response.completed":
                completed = event.response
            elif sink is not None and kind == "response.output_text.delta":
                sink(Delta(kind="text", text=event.delta))
                await asyncio.sleep(0)  # the streams passing pieces on send each one now
            elif sink is not None and kind == "response.function_call_arguments.delta":
                sink(Delta(kind="tool_args", text=event.delta, call_id=getattr(event, "item_id", None)))
                await asyncio.sleep(0)
        if completed is None:
            raise ModelError("the model's stream ended without its reply", retryable=True)
        output = [to_jsonable_python(item, by_alias=True, exclude_none=True) for item in completed.output]
        calls = [_call(item) for item in completed.output if getattr(item, "type", "") == "function_call"]
        texts = [
            getattr(c, "text", "")
            for item in completed.output
            if getattr(item, "type", "") == "message"
            for c in item.content
        ]
        tokens = completed.usage
        usage = foreign.usage_of(getattr(tokens, "input_tokens", 0), getattr(tokens, "output_tokens", 0))
        return Live({"output": output, "usage": usage}, "".join(texts) or None, calls, usage, completed.model)


def _call(item: Any) -> Call:
    try:
        args = json.loads(item.arguments or "{}")
    except ValueError as exc:
        return Call(item.call_id, item.name, None, f"the arguments are not valid JSON: {exc}")
    if not isinstance(args, dict):
        return Call(item.call_id, item.name, None, "the arguments must be a JSON object")
    return Call(item.call_id, item.name, args)


def _tool(tool: Any, replay: Replay) -> Any:
    """The agent's tool as this run calls it."""
    agent = replay.agent
    if not isinstance(tool, FunctionTool) or tool.name not in agent.tools:
        return tool  # a local tool: the SDK runs it here

    async def invoke(ctx: Any, _arguments: str) -> str:
        return json.dumps(tool_value(replay.outcome(ctx.tool_call_id, tool.name)))

    return dataclasses.replace(tool, on_invoke_tool=invoke, needs_approval=False)


async def run_turn(replay: Replay, agent: Agent[Any]) -> Any:
    """Run the SDK's loop over the turn's journal; the agent's final output, once it has one."""
    if not isinstance(agent, Agent):
        raise SchemaError(
            f"{replay.agent.agent} is not an OpenAI Agents SDK Agent but a {type(agent).__name__}"
        )
    if agent.handoffs:
        raise SchemaError(f"agent {replay.agent.name}: handoffs are not supported on Tendon yet")
    names = {getattr(t, "name", "") for t in agent.tools}
    error = foreign.unplaced_tools(
        replay.agent.name, dict.fromkeys(names), replay.agent.tools, replay.agent.local_tools
    )
    if error is not None:
        raise error
    replay.approvals = sorted(
        t.name for t in agent.tools if isinstance(t, FunctionTool) and t.needs_approval and t.name in names
    )
    if not isinstance(agent.model, Model):
        raise SchemaError(
            f"agent {replay.agent.name}: give the agent a model object (e.g. OpenAIChatCompletionsModel), "
            "not a model name, so the Brain knows which API it calls"
        )
    clone = agent.clone(model=TendonModel(agent.model, replay), tools=[_tool(t, replay) for t in agent.tools])
    given: Any = [*history_of(replay.prior), {"role": "user", "content": replay.prompt}]
    try:
        result = await Runner.run(clone, given, run_config=RunConfig(tracing_disabled=True))
    except AgentsException as exc:
        if isinstance(exc.__cause__, ModelError):
            raise exc.__cause__ from exc
        raise ModelError(f"the agent gave up on the model's replies: {exc}", retryable=False) from exc
    return result.final_output


def history_of(prior: list[Message]) -> list[dict[str, Any]]:
    """The thread's earlier turns as the SDK's input items: each reply as the SDK made it, with
    only its Hands tool calls (whose outcomes the thread keeps) and their outputs."""
    out: list[dict[str, Any]] = []
    ours: dict[str, str] = {}  # Tendon call id -> the SDK's
    for m in prior:
        text = m.content.get("text")
        if m.role == "tool" and m.content.get("call_id") in ours:
            output = json.dumps(tool_value(m.content))
            out.append(
                {"type": "function_call_output", "call_id": ours[m.content["call_id"]], "output": output}
            )
        elif m.role in ("user", "steer") and text:
            out.append({"role": "user", "content": str(text)})
        elif m.role == "assistant":
            out += _prior_reply(m.content, ours)
    return out


def _prior_reply(content: dict[str, Any], ours: dict[str, str]) -> list[dict[str, Any]]:
    kept = content.get(foreign.FRAMEWORK_KEY)
    if kept is None or kept.get("name") != "openai-agents":
        return [{"role": "assistant", "content": str(content["text"])}] if content.get("text") else []
    calls = kept.get("calls") or {}
    ours.update({call_id: framework_id for framework_id, call_id in calls.items()})
    return [
        item
        for item in kept["response"]["output"]
        if item.get("type") == "message"
        or (item.get("type") == "function_call" and item.get("call_id") in calls)
    ]
