"""Model adapters, one module each (``scripted``, ``openai_chat``); :class:`Models` makes the one
an agent definition names, once per Brain process."""

from __future__ import annotations

import json
from typing import Any

from brain.models.base import MODEL_KINDS, Delta, Message, ModelAdapter, ModelReply, OnDelta, ToolCall
from brain.models.scripted import ScriptedModel
from protocol import SchemaError

KINDS = MODEL_KINDS


def make_model(spec: dict[str, Any]) -> ModelAdapter:
    """Build the adapter an agent definition's ``model`` names (a SchemaError says what is wrong)."""
    kind = spec.get("kind")
    if kind == "scripted":
        return ScriptedModel(list(spec.get("script", [])))
    if kind == "openai":
        # Imported when an agent asks for it: the client takes a third of a second to import, which
        # every CLI command and every scripted Brain would otherwise pay.
        from brain.models.openai_chat import OpenAIModel, OpenAISpec

        try:
            return OpenAIModel(OpenAISpec.model_validate(spec))
        except ValueError as exc:
            raise SchemaError(f"the agent's openai model is invalid: {exc}") from exc
    raise SchemaError(f"unknown model kind {kind!r} (supported: {', '.join(repr(k) for k in KINDS)})")


class Models:
    """The adapters of one Brain process, by model spec: an API client is made once, not per call,
    and closed when the Brain stops."""

    def __init__(self) -> None:
        self._adapters: dict[str, ModelAdapter] = {}

    def get(self, spec: dict[str, Any]) -> ModelAdapter:
        key = json.dumps(spec, sort_keys=True)
        adapter = self._adapters.get(key)
        if adapter is None:
            adapter = self._adapters[key] = make_model(spec)
        return adapter

    async def close(self) -> None:
        for adapter in self._adapters.values():
            close = getattr(adapter, "close", None)
            if close is not None:
                await close()
        self._adapters.clear()


__all__ = [
    "Delta",
    "Message",
    "ModelAdapter",
    "ModelReply",
    "Models",
    "OnDelta",
    "ScriptedModel",
    "ToolCall",
    "make_model",
]
