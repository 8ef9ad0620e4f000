"""The model adapter contract: history in, one reply (text or tool calls) out."""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    call_id: str
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)


class ModelReply(BaseModel):
    """What the model answered: tool calls to make, or final content."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: dict[str, int] = Field(default_factory=dict)


class Message(BaseModel):
    """One history entry as adapters see it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: str  # user | assistant | tool
    turn_id: str
    content: dict[str, Any]


class ModelAdapter(Protocol):
    async def complete(
        self,
        *,
        instructions: str,
        history: list[Message],
        turn_id: str,
        tools: list[dict[str, Any]],
    ) -> ModelReply: ...
