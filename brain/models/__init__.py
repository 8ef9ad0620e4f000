"""Model adapters. Each lives in its own module; ``make_model`` picks one by ``kind``."""

from brain.models.base import Message, ModelAdapter, ModelReply, ToolCall
from brain.models.scripted import ScriptedModel, make_model

__all__ = ["Message", "ModelAdapter", "ModelReply", "ScriptedModel", "ToolCall", "make_model"]
