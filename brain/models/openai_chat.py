"""An OpenAI-compatible chat-completions model, through the official ``openai`` client: hosted
APIs, vLLM, Ollama and LiteLLM all speak it.

    "model": {"kind": "openai", "name": "gpt-4o-mini",
              "base_url": "http://127.0.0.1:8000/v1",   # optional: else OPENAI_BASE_URL
              "api_key_env": "MY_KEY",                  # optional: else OPENAI_API_KEY
              "timeout": 60, "temperature": 0.2, "stream": true}

The model sees the thread's tools (the frozen bindings' JSON Schemas) and may call several at
once. A reply is streamed by default; its pieces go to ``on_delta`` as they come and the whole
reply is what gets committed. The client never retries on its own (``max_retries=0``): every
failure is classified (:func:`classify`) and the turn's persisted retry policy decides.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import time
from collections.abc import Mapping
from typing import Any

import openai
from pydantic import BaseModel, ConfigDict, Field

from brain.models.base import Delta, Message, ModelReply, OnDelta, ToolCall
from protocol import ModelError, SchemaError


class OpenAISpec(BaseModel):
    """The ``model`` part of an agent definition for this adapter."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = "openai"
    name: str = Field(min_length=1)
    base_url: str | None = None
    api_key_env: str | None = None
    timeout: float = Field(default=120.0, gt=0)
    temperature: float | None = None
    stream: bool = True


# ---- the wire: Tendon's history as chat messages, bindings as tools ------------------------


def chat_messages(instructions: str, history: list[Message]) -> list[dict[str, Any]]:
    """The conversation in the chat-completions shape."""
    out: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    for m in history:
        c = m.content
        if m.role == "user":
            out.append({"role": "user", "content": str(c.get("text", ""))})
        elif m.role == "steer":
            out.append({"role": "system", "content": str(c.get("text", ""))})
        elif m.role == "assistant":
            message: dict[str, Any] = {"role": "assistant", "content": c.get("text")}
            calls = c.get("tool_calls") or []
            if calls:
                message["tool_calls"] = [
                    {
                        "id": call["call_id"],
                        "type": "function",
                        "function": {
                            "name": call["tool"],
                            "arguments": call.get("raw_args") or json.dumps(call.get("args") or {}),
                        },
                    }
                    for call in calls
                ]
            out.append(message)
        elif m.role == "tool":
            outcome = {k: c.get(k) for k in ("status", "result", "error") if c.get(k) is not None}
            out.append({"role": "tool", "tool_call_id": c["call_id"], "content": json.dumps(outcome)})
    return out


def chat_tools(bindings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": b["name"],
                "description": b.get("description") or b["name"],
                "parameters": b["input_schema"],
            },
        }
        for b in sorted(bindings, key=lambda b: b["name"])
    ]


def tool_call(call_id: str, name: str, arguments: str) -> ToolCall:
    """A tool call from the model's raw arguments; arguments that are not a JSON object make a
    call with an ``error`` (it goes back to the model as a failed tool result)."""
    try:
        args = json.loads(arguments or "{}")
    except ValueError as exc:
        return ToolCall(call_id=call_id, tool=name, error=f"the arguments are not valid JSON: {exc}")
    if not isinstance(args, dict):
        return ToolCall(call_id=call_id, tool=name, error="the arguments must be a JSON object")
    return ToolCall(call_id=call_id, tool=name, args=args)


def unique_call_id(given: str | None, taken: set[str]) -> str:
    """The model's call id, unless it is missing or was used before in this turn (some servers
    number every reply's calls from 0): then one of Tendon's own."""
    if given and given not in taken:
        return given
    n = len(taken) + 1
    while f"call-{n}" in taken:
        n += 1
    return f"call-{n}"


# ---- errors ------------------------------------------------------------------------------------

RETRYABLE_STATUS = frozenset({408, 409, 429})


def retry_after_seconds(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """What a response asks to wait before trying again: ``retry-after-ms``, or ``retry-after`` as
    seconds or as an HTTP date; None without one."""
    if not headers:
        return None
    lower = {k.lower(): v for k, v in headers.items()}
    try:
        if "retry-after-ms" in lower:
            return max(0.0, float(lower["retry-after-ms"]) / 1000)
        value = lower.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value).timestamp()
            return max(0.0, when - (time.time() if now is None else now))
    except (TypeError, ValueError, IndexError):
        return None


def _transport(exc: BaseException) -> str | None:
    """ "timeout" or "lost" for an error of the HTTP library under the client (a read cut short in
    the middle of a stream is raised as it is, not wrapped); None for anything else. Told by its
    classes' names: the client has used both ``httpx`` and its successor ``httpx2``."""
    for cls in type(exc).__mro__:
        if cls.__module__.split(".")[0] in ("httpx", "httpx2"):
            if cls.__name__ == "TimeoutException":
                return "timeout"
            if cls.__name__ == "TransportError":
                return "lost"
    return None


def classify(exc: BaseException) -> ModelError:
    """What a failed model call means: timeouts, lost connections (even mid-stream), 408, 409,
    429 and 5xx are worth trying again (a 429 after what it asked); other 4xx and replies that
    are not what the API promises are not."""
    if isinstance(exc, ModelError):
        return exc
    transport = _transport(exc)
    if isinstance(exc, openai.APITimeoutError) or transport == "timeout":
        return ModelError("the model API timed out", retryable=True)
    if isinstance(exc, openai.APIConnectionError) or transport == "lost":
        return ModelError(f"the connection to the model API failed: {_said(exc)}", retryable=True)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        retryable = status in RETRYABLE_STATUS or status >= 500
        wait = retry_after_seconds(exc.response.headers) if retryable else None
        return ModelError(
            f"the model API answered {status}: {_said(exc)}", retryable=retryable, retry_after=wait
        )
    if isinstance(exc, openai.APIResponseValidationError | ValueError | KeyError | TypeError):
        return ModelError(f"the model API sent a malformed reply: {_said(exc)}", retryable=False)
    if isinstance(exc, openai.OpenAIError):
        return ModelError(f"the model call failed: {_said(exc)}", retryable=False)
    raise exc


def _said(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "…"


# ---- the adapter --------------------------------------------------------------------------------


class OpenAIModel:
    """One model of one OpenAI-compatible API; its HTTP client is kept for the process."""

    def __init__(self, spec: OpenAISpec) -> None:
        self.spec = spec
        api_key = os.environ.get(spec.api_key_env) if spec.api_key_env else None
        if spec.api_key_env and not api_key:
            raise SchemaError(
                f"the agent's model reads its API key from {spec.api_key_env}, which is not set"
            )
        # Unset: the client reads OPENAI_BASE_URL and OPENAI_API_KEY itself. A local server
        # (vLLM, Ollama) often needs no key: a placeholder keeps the client from refusing to start.
        if api_key is None and not os.environ.get("OPENAI_API_KEY"):
            api_key = "not-needed"
        self.client = openai.AsyncOpenAI(
            base_url=spec.base_url, api_key=api_key, max_retries=0, timeout=spec.timeout
        )

    async def close(self) -> None:
        await self.client.close()

    async def complete(
        self,
        *,
        instructions: str,
        history: list[Message],
        turn_id: str,
        tools: list[dict[str, Any]],
        on_delta: OnDelta | None = None,
    ) -> ModelReply:
        request: dict[str, Any] = {"model": self.spec.name, "messages": chat_messages(instructions, history)}
        if tools:
            request["tools"] = chat_tools(tools)
        if self.spec.temperature is not None:
            request["temperature"] = self.spec.temperature
        taken = {
            c["call_id"]
            for m in history
            if m.role == "assistant" and m.turn_id == turn_id
            for c in m.content.get("tool_calls") or []
        }
        try:
            if self.spec.stream:
                return await self._streamed(request, taken, on_delta)
            return self._whole(await self.client.chat.completions.create(**request), taken)
        except Exception as exc:
            raise classify(exc) from exc

    def _whole(self, completion: Any, taken: set[str]) -> ModelReply:
        if not completion.choices:
            raise ModelError("the model API sent a reply without choices", retryable=False)
        message = completion.choices[0].message
        calls = []
        for c in message.tool_calls or []:
            call_id = unique_call_id(c.id, taken)
            taken.add(call_id)
            calls.append(tool_call(call_id, c.function.name, c.function.arguments))
        return ModelReply(
            content=message.content, tool_calls=calls, usage=_usage(completion.usage), model=completion.model
        )

    async def _streamed(
        self, request: dict[str, Any], taken: set[str], on_delta: OnDelta | None
    ) -> ModelReply:
        stream = await self.client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}  # by index: id, name, arguments so far
        usage: dict[str, int] = {}
        model = None
        finished = False
        async for chunk in stream:
            model = chunk.model or model
            if chunk.usage is not None:
                usage = _usage(chunk.usage)
            for choice in chunk.choices or []:
                finished = finished or choice.finish_reason is not None
                delta = choice.delta
                if delta is None:
                    continue
                if delta.content:
                    text.append(delta.content)
                    if on_delta is not None:
                        on_delta(Delta(kind="text", text=delta.content))
                for piece in delta.tool_calls or []:
                    call = calls.setdefault(piece.index, {"id": None, "name": "", "arguments": ""})
                    call["id"] = call["id"] or piece.id
                    if piece.function is not None:
                        call["name"] += piece.function.name or ""
                        call["arguments"] += piece.function.arguments or ""
                        if piece.function.arguments and on_delta is not None:
                            on_delta(
                                Delta(
                                    kind="tool_args",
                                    text=piece.function.arguments,
                                    call_id=call["id"],
                                    tool=call["name"] or None,
                                )
                            )
            if on_delta is not None:
                # A burst of chunks already read is parsed without a pause: let the streams that
                # pass the pieces on send each one now, not once the whole reply is in.
                await asyncio.sleep(0)
        if not finished:
            # A stream cut short looks like one that ended, to a client reading to the end.
            raise ModelError(
                "the connection to the model API was lost before the reply ended", retryable=True
            )
        tool_calls = []
        for index in sorted(calls):
            call = calls[index]
            if not call["name"]:
                raise ModelError("the model API streamed a tool call without a name", retryable=False)
            call_id = unique_call_id(call["id"], taken)
            taken.add(call_id)
            tool_calls.append(tool_call(call_id, call["name"], call["arguments"]))
        content = "".join(text) if text else None
        return ModelReply(content=content, tool_calls=tool_calls, usage=usage, model=model)


def _usage(usage: Any) -> dict[str, int]:
    if usage is None:
        return {}
    out = {}
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = getattr(usage, key, None)
        if isinstance(value, int):
            out[key] = value
    return out
