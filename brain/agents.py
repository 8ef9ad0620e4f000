"""Agent definitions: versioned data (name, version, instructions, model, tools, limits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from protocol import SchemaError, digest, loads


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_model_calls: int = Field(default=50, ge=1)


class AgentDefinition(BaseModel):
    """One version of an agent. A thread keeps the version it started with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    instructions: str = ""
    model: dict[str, Any] = Field(description="adapter settings; `kind` picks the adapter")
    tools: list[str] = Field(default_factory=list)
    limits: Limits = Limits()

    @property
    def digest(self) -> str:
        return digest(self.model_dump(mode="json"))

    @classmethod
    def from_file(cls, path: str | Path) -> AgentDefinition:
        """Load a definition from a JSON file, with a clear error for bad content."""
        try:
            data = loads(Path(path).read_bytes())
        except OSError as exc:
            raise SchemaError(f"cannot read agent definition {path}: {exc.strerror}") from exc
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"])) or "<root>"
            raise SchemaError(f"agent definition {path} is invalid at {where}: {first['msg']}") from exc
