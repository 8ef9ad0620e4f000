"""The model adapter contract: history in, one reply (text or tool calls) out.

An adapter never retries on its own: it raises :class:`~protocol.ModelError` saying whether
trying again can help (and how long the API asked to wait), and the turn's persisted retry
policy decides. Streamed pieces of a reply may go to ``on_delta`` as they come (live previews,
never stored); the reply it returns is the truth that gets committed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

# The adapters a Brain has, by the ``kind`` an agent definition's ``model`` names: a submit naming
# another is refused (``brain.rules.admission``), before a turn could fail on it.
MODEL_KINDS = ("scripted", "openai")


class ToolCall(BaseModel):
    """A tool call of a reply. ``error``: why its arguments cannot be used as the model gave them
    (not JSON, not an object): the call then goes back to the model as a failed tool result."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    call_id: str
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None


class ModelReply(BaseModel):
    """What the model answered: tool calls to make, or final content, and what it cost."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: dict[str, int] = Field(default_factory=dict)
    model: str | None = None  # the model that answered, as the API named it


class Message(BaseModel):
    """One history entry as adapters see it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: str  # user | assistant | tool | steer
    turn_id: str
    content: dict[str, Any]


class Delta(BaseModel):
    """A streamed piece of a reply in progress: text, or a piece of a tool call's arguments."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["text", "tool_args"]
    text: str
    call_id: str | None = None
    tool: str | None = None


OnDelta = Callable[[Delta], None]


class ModelAdapter(Protocol):
    async def complete(
        self,
        *,
        instructions: str,
        history: list[Message],
        turn_id: str,
        tools: list[dict[str, Any]],
        on_delta: OnDelta | None = None,
    ) -> ModelReply: ...
