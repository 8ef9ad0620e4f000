"""Agent definitions: versioned data (name, version, instructions, model, tools, limits, retry
policy). A thread keeps the version it started with; one name and version is one content."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticSerializationError

from brain.rules.retry import RetryPolicy
from protocol import SchemaError, digest, loads
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

    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    instructions: str = ""
    model: dict[str, Any] = Field(description="adapter settings; `kind` picks the adapter")
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
            raise SchemaError(f"agent definition {path} is {_invalid(exc)}") from exc


def _invalid(exc: ValidationError) -> str:
    """Where a definition is invalid and why, from its first error."""
    first = exc.errors()[0]
    return f"invalid at {'.'.join(map(str, first['loc'])) or '<root>'}: {first['msg']}"


class FrozenThreads:
    """Agent definitions and frozen threads, read once per Brain process, not once per run.

    Neither changes once written: an agent version is immutable (a different definition under
    the same version is refused at submit), and a thread's bindings, once frozen, stay. A
    thread whose bindings are not frozen yet is read every time. Bounded: when full, it
    starts over (a re-read is always correct).
    """

    def __init__(self, store: Any, limit: int = 1024) -> None:
        self.store = store
        self.limit = limit
        self._agents: dict[tuple[str, str], AgentDefinition] = {}
        self._threads: dict[str, Mapping[str, Any]] = {}

    async def get(self, conn: Any, thread_id: str) -> tuple[AgentDefinition, Mapping[str, Any]]:
        thread = self._threads.get(thread_id)
        if thread is None:
            thread = self._read(await self.store.thread(conn, thread_id))
        return await self._with_agent(conn, thread)

    def known(self, thread_id: str) -> tuple[AgentDefinition, Mapping[str, Any]] | None:
        """What ``get`` would return, when it is kept here (no read at all); else None."""
        thread = self._threads.get(thread_id)
        agent = None if thread is None else self._agents.get((thread["agent_name"], thread["agent_version"]))
        return None if thread is None or agent is None else (agent, thread)

    async def get_many(
        self, conn: Any, thread_ids: Collection[str]
    ) -> dict[str, tuple[AgentDefinition, Mapping[str, Any]]]:
        """``get`` for several threads (the turns of one claim or apply): those not kept here are
        read in one statement. A thread that is not there, or whose agent's stored definition does
        not validate, is left out: one turn's problem does not fail a claim of many."""
        # Those kept here are taken first: keeping the ones read may start the cache over.
        threads = {t: self._threads[t] for t in set(thread_ids) if t in self._threads}
        unknown = sorted(set(thread_ids) - threads.keys())
        if unknown:
            threads.update({r["id"]: self._read(r) for r in await self.store.threads(conn, unknown)})
        found = {}
        for t, thread in threads.items():
            try:
                found[t] = await self._with_agent(conn, thread)
            except SchemaError:
                continue  # that turn's own ``get`` meets it, and fails that turn alone
        return found

    def _read(self, row: Any) -> Mapping[str, Any]:
        thread = dict(row)
        if thread["bindings"] is not None:
            self._keep(self._threads, thread["id"], thread)
        return thread

    async def _with_agent(
        self, conn: Any, thread: Mapping[str, Any]
    ) -> tuple[AgentDefinition, Mapping[str, Any]]:
        key = (thread["agent_name"], thread["agent_version"])
        agent = self._agents.get(key)
        if agent is None:
            try:
                agent = AgentDefinition.model_validate(await self.store.agent_definition(conn, *key))
            except ValidationError as exc:  # e.g. stored by a version of Tendon that allowed it
                raise SchemaError(
                    f"the stored definition of agent {key[0]} version {key[1]} is {_invalid(exc)}"
                ) from exc
            self._keep(self._agents, key, agent)
        return agent, thread

    def keep_frozen(self, thread: Mapping[str, Any], bindings: Mapping[str, Any]) -> None:
        """Keep a thread whose bindings a transaction froze (call after it committed)."""
        self._keep(self._threads, thread["id"], {**thread, "bindings": bindings})

    def _keep(self, cache: dict[Any, Any], key: Any, value: Any) -> None:
        if len(cache) >= self.limit:
            cache.clear()
        cache[key] = value
