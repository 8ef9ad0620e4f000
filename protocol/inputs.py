"""The bodies of a person's input to a running execution: what it asks (an ``input_required``
event) and the answer (an ``input`` control). Their envelopes are in ``protocol.envelopes``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputBody(_Model):
    """A person's answer to what a running execution asked for (its ``input_required`` event
    with the same ``key``): ``answer`` (any JSON) or ``decline``. ``request_id`` is the answer's
    control: the Hands keep the first answer to a key and take a repeat as a duplicate."""

    key: str = Field(min_length=1, max_length=200)
    decision: Literal["answer", "decline"]
    answer: Any = None
    reason: str | None = None
    request_id: str = Field(min_length=1, max_length=200)


class InputRequiredBody(_Model):
    """A running execution waits for a person's input (an MCP task in ``input_required``): what
    it asks (``message``, and the server's requests as they came), under ``key``, the round of
    questions an answer (:class:`InputBody`) names. No status change: it runs on, and waits."""

    key: str = Field(min_length=1, max_length=200)
    message: str = ""
    requests: dict[str, Any] = Field(default_factory=dict)


__all__ = ["InputBody", "InputRequiredBody"]
