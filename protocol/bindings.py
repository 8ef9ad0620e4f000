"""Tool bindings: the frozen description of a tool that the Brain keeps and Hands serve."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from protocol.codec import digest


class ReplayPolicy(StrEnum):
    """Whether a tool may be run again after a crash inside its body."""

    SAFE = "safe"
    UNSAFE = "unsafe"


class ToolBinding(BaseModel):
    """What a Hands pool announces for one tool; the digest pins every other field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    route: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9_-]*$")
    description: str = ""
    input_schema: dict[str, Any]
    replay_policy: ReplayPolicy
    has_query: bool = False
    digest: str = Field(min_length=64, max_length=64)

    @staticmethod
    def compute_digest(
        *,
        name: str,
        version: str,
        route: str,
        input_schema: dict[str, Any],
        replay_policy: ReplayPolicy,
        description: str = "",
        has_query: bool = False,
    ) -> str:
        return digest(
            {
                "name": name,
                "version": version,
                "route": route,
                "description": description,
                "input_schema": input_schema,
                "replay_policy": str(replay_policy),
                "has_query": has_query,
            }
        )

    @classmethod
    def build(cls, **fields: Any) -> ToolBinding:
        """Make a binding and compute its digest from its other fields."""
        return cls(**fields, digest=cls.compute_digest(**fields))
