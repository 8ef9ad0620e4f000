"""Tool bindings: the frozen description of a tool that the Brain keeps and Hands serve."""

from __future__ import annotations

import re
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
    requires_approval: bool = False  # every call waits for a person to approve it (`brain respond`)
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
        requires_approval: bool = False,
    ) -> str:
        fields: dict[str, Any] = {
            "name": name,
            "version": version,
            "route": route,
            "description": description,
            "input_schema": input_schema,
            "replay_policy": str(replay_policy),
            "has_query": has_query,
        }
        if requires_approval:  # only then: bindings made before the field keep their digest
            fields["requires_approval"] = True
        return digest(fields)

    @classmethod
    def build(cls, **fields: Any) -> ToolBinding:
        """Make a binding and compute its digest from its other fields."""
        return cls(**fields, digest=cls.compute_digest(**fields))


# Versions named by a digest of the tool's definition: an MCP server's tool (``mcp-``) and an agent
# framework's function tool (``pydantic-ai-``, ``openai-agents-``) without a version of its own.
# Two of them have no natural order: of those, the one announced later is the newer.
CONTENT_VERSIONS = ("mcp-", "pydantic-ai-", "openai-agents-")


def is_content_version(version: str) -> bool:
    """Whether ``version`` is a digest of its tool's definition (``CONTENT_VERSIONS``)."""
    return version.startswith(CONTENT_VERSIONS)


def version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """Versions in their natural order: "2" before "10", "1.9" before "1.10"."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in re.findall(r"\d+|[^\d.]+", version)
    )
