"""Agent definitions: versioned data (name, version, instructions, model, tools, limits, retry
policy). A thread keeps the version it started with; one name and version is one content."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticSerializationError

from brain.rules.delegation import Delegate
from brain.rules.names import MAX_AGENT_VERSION, AgentName, AgentVersion, shown
from brain.rules.retry import RetryPolicy
from protocol import DecodeError, SchemaError, digest, loads
from protocol.codec import Encoded
from protocol.storable import unstorable


class ManualTool(BaseModel):
    """A tool a person answers: the model calls it like any other, and the turn waits until
    someone gives its result (`brain respond TURN CALL --result JSON`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})

    def binding(self) -> dict[str, Any]:
        """What a thread freezes for it, beside the Hands pools' bindings."""
        fields = self.model_dump(mode="json")
        return {**fields, "version": "manual", "route": "manual", "replay_policy": "unsafe", "manual": True,
                "digest": digest(fields)}  # fmt: skip


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_model_calls: int = Field(default=50, ge=1, description="model steps of one turn at most")
    max_tool_calls: int = Field(default=200, ge=1, description="tool calls of one turn at most")
    max_crashes: int = Field(
        default=3, ge=1, description="times a Brain may die at one phase of a turn before the turn fails"
    )


# Fields added after definitions were first stored: left out of the digest while they hold their
# default, so that a definition written before them keeps its digest (and its pinned threads).
_LATER_DEFAULTS: dict[str, Any] = {
    "journal": "outcomes",
    "retry": RetryPolicy().model_dump(mode="json"),
    "approvals": [],
    "manual_tools": [],
    "expect_tools": [],
    "delegates": {},
    "framework": None,
    "agent": None,
    "local_tools": [],
}
_LATER_LIMITS: dict[str, Any] = {"max_tool_calls": 200, "max_crashes": 3}


def _digest(content: dict[str, Any]) -> str:
    content = {**content, "limits": dict(content["limits"])}
    for key, default in _LATER_DEFAULTS.items():
        if content[key] == default:
            del content[key]
    for key, default in _LATER_LIMITS.items():
        if content["limits"][key] == default:
            del content["limits"][key]
    return digest(content)


@dataclass(frozen=True)
class _Form:
    problem: str | None  # why the record cannot store it (protocol.storable.unstorable), else None
    digest: str
    stored: Encoded | None


class _Forms:
    """A definition's digest and stored form, kept by its JSON (pydantic's, 9 us to make): a
    client sends the same definition with every turn, and making them again took 130 us of a
    submit (a slow host's figure; the JSON form and its encoding, twice), and the walk for text
    the record cannot store 35 more. A memo of what the definition's content alone decides, so
    one per process serves every store and Brain in it."""

    LIMIT = 256

    def __init__(self) -> None:
        self.kept: dict[str, _Form] = {}

    def of(self, agent: AgentDefinition) -> _Form:
        try:
            key = agent.model_dump_json()
        except PydanticSerializationError:  # text that is no Unicode (a lone surrogate): not kept
            return _Form(unstorable(agent.model_dump(mode="json")) or "is not valid Unicode", "", None)
        found = self.kept.get(key)
        if found is None:
            content = agent.model_dump(mode="json")
            problem = unstorable(content)
            # What the record cannot store has no digest or stored form: nothing may be written with it.
            found = _Form(problem, "", None) if problem else _Form(None, _digest(content), Encoded(content))
            if len(self.kept) >= self.LIMIT:
                self.kept.clear()
            self.kept[key] = found
        return found


_FORMS = _Forms()


class AgentDefinition(BaseModel):
    """One version of an agent. A thread keeps the version it started with."""

    # Its JSON is the key of its digest (_Forms): an infinity in its free-form settings (the
    # model's, a manual tool's schema) must not read there as the null another one may hold.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")

    name: AgentName
    version: AgentVersion
    instructions: str = ""
    model: dict[str, Any] = Field(
        default_factory=dict,
        description="adapter settings; `kind` picks the adapter (none for an agent of a framework, "
        "whose own model is used)",
    )
    tools: list[str] = Field(default_factory=list)
    limits: Limits = Limits()
    journal: Literal["outcomes", "detailed"] = Field(
        default="outcomes",
        description="what the journal records of each tool execution: its outcome (`outcomes`), or "
        "also its acceptance and its start (`detailed`)",
    )
    retry: RetryPolicy = Field(default_factory=RetryPolicy, description="retries of failed model calls")
    approvals: list[str] = Field(
        default_factory=list, description="tools whose every call waits for a person to approve it"
    )
    manual_tools: list[ManualTool] = Field(
        default_factory=list, description="tools a person answers (not run by any Hands pool)"
    )
    expect_tools: list[str] = Field(
        default_factory=list,
        description="tools of `tools` that no Hands pool may have announced yet: a submit takes them "
        "(its turn waits for a pool to announce them) instead of refusing them as unknown",
    )

    delegates: dict[str, Delegate] = Field(
        default_factory=dict,
        description="tools that start a turn of another agent in a child thread (brain.rules.delegation)",
    )
    framework: Literal["pydantic-ai", "openai-agents"] | None = Field(
        default=None,
        description="an agent written with this framework (kind python): the Brain runs the "
        "framework's own loop for each turn (docs/frameworks.md)",
    )
    agent: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$",
        description="where a framework's agent is: `module:attribute` (e.g. `myapp.agents:support`)",
    )
    local_tools: list[str] = Field(
        default_factory=list,
        description="tools of a framework's agent that run in the Brain itself (pure: no side "
        "effect, the same answer on every replay); the others are Hands executions named in `tools`",
    )

    @model_validator(mode="after")
    def _expected_are_tools(self) -> AgentDefinition:
        strays = sorted(set(self.expect_tools) - set(self.tools))
        if strays:
            raise ValueError(f"expect_tools names {', '.join(strays)}, which `tools` does not")
        clash = sorted(set(self.delegates) & (set(self.tools) | {m.name for m in self.manual_tools}))
        if clash:
            raise ValueError(f"delegates names {', '.join(clash)}, which is a tool already")
        if (self.framework is None) != (self.agent is None):
            raise ValueError("`framework` and `agent` go together: a framework's agent names both")
        if self.framework is None and not self.model:
            raise ValueError("`model` is required (unless the agent is a framework's: `framework`, `agent`)")
        if self.framework is not None and self.model:
            raise ValueError("a framework's agent uses its own model: leave `model` out")
        if self.local_tools and self.framework is None:
            raise ValueError("`local_tools` is for a framework's agent")
        both = sorted(set(self.local_tools) & set(self.tools))
        if both:
            raise ValueError(f"{', '.join(both)} cannot be both local (local_tools) and a Hands tool (tools)")
        if self.framework is not None and self.delegates:
            raise ValueError("a framework's agent cannot have `delegates`: its own loop never calls them")
        return self

    @property
    def foreign(self) -> bool:
        """An agent a framework's loop runs (kind python), not Tendon's own loop over this data."""
        return self.framework is not None

    @property
    def unstorable(self) -> str | None:
        """Why the record cannot store this definition (text with a NUL, say), or None."""
        return _FORMS.of(self).problem

    @property
    def digest(self) -> str:
        return self._storable().digest

    @property
    def stored(self) -> Encoded:
        """The definition as the record stores it: its JSON form, encoded once."""
        stored = self._storable().stored
        assert stored is not None
        return stored

    def _storable(self) -> _Form:
        form = _FORMS.of(self)
        if form.problem:
            raise SchemaError(f"agent {self.name} cannot be stored: its text {form.problem}")
        return form

    def versioned_by_content(self) -> AgentDefinition:
        """This definition under a version its content decides (``1+3fa9c2d1e0ab``): what a local
        development server registers, so that an edited file is a new version of the same name
        instead of a CONFLICT (the same content always gets the same version)."""
        version = f"{self.version}+{self.digest[:12]}"
        if len(version) > MAX_AGENT_VERSION:
            raise SchemaError(
                f"agent {self.name} version {shown(self.version)} is too long for a local development "
                f"server, which adds its content's digest: at most {MAX_AGENT_VERSION - 13} characters"
            )
        # Its delegates' agents too: an edited child is a new version of its name, not a CONFLICT.
        delegates = {
            n: d.model_copy(update={"agent": d.agent.versioned_by_content()})
            for n, d in self.delegates.items()
        }
        return self.model_copy(update={"version": version, "delegates": delegates})

    @classmethod
    def from_file(cls, path: str | Path) -> AgentDefinition:
        """Load a definition from a JSON file, with a clear error for bad content."""
        try:
            data = loads(Path(path).read_bytes())
        except OSError as exc:
            raise SchemaError(f"cannot read agent definition {path}: {exc.strerror}") from exc
        except DecodeError as exc:
            raise SchemaError(f"agent definition {path} is not strict JSON: {exc.message}") from exc
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise SchemaError(f"agent definition {path} is {invalid(exc)}") from exc


Delegate.model_rebuild(_types_namespace={"AgentDefinition": AgentDefinition})
AgentDefinition.model_rebuild()


def invalid(exc: ValidationError) -> str:
    """Where a definition is invalid and why, from its first error."""
    first = exc.errors()[0]
    return f"invalid at {'.'.join(map(str, first['loc'])) or '<root>'}: {first['msg']}"
