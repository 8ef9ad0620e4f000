"""Every message on the broker is one of these envelopes.

An envelope has a fixed header (protocol version, message id, kind, execution id,
namespace and session for scoping, request digest, seq where it applies) and either an
inline ``body`` or a ``body_ref`` pointing at the same body stored in S3.
"""

from __future__ import annotations

import os
import secrets
import time
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_serializer,
    model_validator,
)

from protocol.bindings import ReplayPolicy, ToolBinding
from protocol.inputs import InputBody, InputRequiredBody

PROTOCOL_VERSION = 1


# A random UUID's version (4) and variant (RFC 9562) bits, set in 128 random ones.
_V4_CLEAR = ~(0xF << 76 | 0x3 << 62) & (1 << 128) - 1
_V4_SET = 0x4 << 76 | 0x2 << 62


def new_id() -> str:
    """A random UUID (version 4) in hex, made straight from 16 random bytes: ``uuid.uuid4().hex``
    builds a ``UUID`` on the way (2.4 against 1.1 us, and every envelope takes an id)."""
    return f"{int.from_bytes(os.urandom(16), 'big') & _V4_CLEAR | _V4_SET:032x}"


def new_timed_id() -> str:
    """A UUIDv7 in hex: its first 48 bits are the Unix time in milliseconds, so whoever receives
    it can tell how old it is (the Hands do, for commands older than their ledger keeps)."""
    value = (time.time_ns() // 1_000_000) << 80 | 0x7 << 76 | secrets.randbits(76)
    value = value & ~(0x3 << 62) | 0x2 << 62  # the RFC 9562 variant
    return f"{value:032x}"


def id_time(value: str) -> float | None:
    """The Unix time a :func:`new_timed_id` (or an id ending in one) was made at; None for any
    other id, such as a random one."""
    tail = value[-32:]
    if len(tail) != 32 or tail[12] != "7" or any(c not in "0123456789abcdef" for c in tail):
        return None
    return int(tail[:12], 16) / 1000


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ObjectRef(_Model):
    """A verified reference to a payload in object storage.

    ``scope`` is the ``namespace/session_id`` the object belongs to; ``bound_to`` is the one
    message it was written for (``execution_id/kind/seq`` for an event, ``execution_id/kind``
    for a command or control). A receiver uses the object only as the body of that message.
    """

    uri: str = Field(pattern=r"^(s3|file)://")
    sha256: str = Field(min_length=64, max_length=64, pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    scope: str = Field(min_length=1)
    bound_to: str = Field(min_length=1)


# ---- bodies -----------------------------------------------------------------------------


class ExecuteBody(_Model):
    """Start one tool execution. The execution id in the header is its operation id."""

    turn_id: str
    call_id: str
    route: str
    tool: str
    binding_digest: str
    replay_policy: ReplayPolicy
    args: dict[str, Any]


class CancelBody(_Model):
    reason: str = ""


class ReplayBody(_Model):
    """Ask Hands to send an execution's events again, from ``from_seq`` on, from its ledger."""

    from_seq: int = Field(ge=1)


class ReconcileBody(_Model):
    """An operator's resolution of an UNKNOWN execution: what happened, how they know, who says
    so. Exactly one of ``result`` (any JSON, null included: the execution succeeded) or
    ``failure`` (a message: it failed) is present. ``request_id`` is the operator's idempotency
    key: the Hands take a second reconcile of one execution with the same key as a duplicate."""

    model_config = ConfigDict(
        json_schema_extra={"oneOf": [{"required": ["result"]}, {"required": ["failure"]}]}
    )

    result: Any = None
    failure: str | None = Field(default=None, min_length=1)
    evidence: str = Field(min_length=1)
    actor: str = Field(min_length=1)
    request_id: str = Field(min_length=1, max_length=200)

    @model_validator(mode="after")
    def _one_outcome(self) -> ReconcileBody:
        given = self.model_fields_set
        failing = self.failure is not None
        # A null result is a result; a null failure is no failure, and not a way to send both keys.
        if ("result" in given) == failing or ("failure" in given and not failing):
            raise ValueError("a reconcile carries exactly one of result (any JSON) or failure (a message)")
        return self

    @model_serializer(mode="wrap")
    def _given_keys_only(self, handler: Any) -> Any:
        # Absent and null differ for a result, so the key not given stays off the wire.
        data = handler(self)
        if "result" not in self.model_fields_set:
            data.pop("result", None)
        if self.failure is None:
            data.pop("failure", None)
        return data

    @property
    def succeeded(self) -> bool:
        return self.failure is None


class AcceptedBody(_Model):
    worker: str


class StartedBody(_Model):
    attempt: int = Field(ge=1)
    worker: str
    reason: Literal["first_run", "rerun_after_crash"] = "first_run"


class OutputPageBody(_Model):
    """A page of tool output with its byte offset; a lost range shows as a gap in offsets."""

    offset: int = Field(ge=0)
    data: str


class SucceededBody(_Model):
    result: Any = None
    output_bytes: int = Field(default=0, ge=0)
    how: Literal["ran", "verified_by_query", "reconciled"] = "ran"
    evidence: str | None = None


class FailedBody(_Model):
    error: dict[str, str]
    output_bytes: int = Field(default=0, ge=0)
    how: Literal["ran", "rejected", "verified_by_query", "reconciled"] = "ran"
    evidence: str | None = None


class CancelledBody(_Model):
    reason: str = ""


class UnknownBody(_Model):
    reason: str


class BindingsBody(_Model):
    route: str
    worker: str
    bindings: list[ToolBinding]


# ---- envelopes --------------------------------------------------------------------------


class _Envelope(_Model):
    v: Literal[1] = 1
    message_id: str = Field(default_factory=new_id)
    body_ref: ObjectRef | None = None

    @field_validator("v", mode="before")
    @classmethod
    def _version_is_an_integer(cls, value: Any) -> Any:
        if type(value) is not int:
            raise ValueError(f"Input should be 1 (protocol version as a JSON integer), got {value!r}")
        return value

    @model_validator(mode="after")
    def _body_xor_ref(self) -> _Envelope:
        body = getattr(self, "body", None)
        if (body is None) == (self.body_ref is None):
            raise ValueError("an envelope carries exactly one of body or body_ref")
        return self


class _ExecutionEnvelope(_Envelope):
    execution_id: str = Field(min_length=1)
    namespace: str = Field(min_length=1)
    session_id: str = Field(min_length=1)
    request_digest: str = Field(min_length=64, max_length=64)
    # The W3C traceparent of the span this message continues (a command: the Brain's model call
    # that asked for the tool), when tracing is on.
    trace: str | None = Field(default=None, max_length=128, exclude_if=lambda v: v is None)

    @property
    def scope(self) -> str:
        return f"{self.namespace}/{self.session_id}"


class ExecuteCommand(_ExecutionEnvelope):
    kind: Literal["execute"] = "execute"
    body: ExecuteBody | None = None


class CancelControl(_ExecutionEnvelope):
    kind: Literal["cancel"] = "cancel"
    body: CancelBody | None = None


class ReplayControl(_ExecutionEnvelope):
    kind: Literal["replay"] = "replay"
    body: ReplayBody | None = None


class ReconcileControl(_ExecutionEnvelope):
    """Resolve an UNKNOWN execution (a Brain sends it for an operator; its message id is derived
    from the execution and the request id, so a repeated request is the same message)."""

    kind: Literal["reconcile"] = "reconcile"
    body: ReconcileBody | None = None


class InputControl(_ExecutionEnvelope):
    """A person's answer to an execution's ``input_required`` (a Brain sends it for `brain
    respond`; its message id is derived from the execution and the request id)."""

    kind: Literal["input"] = "input"
    body: InputBody | None = None


class _Event(_ExecutionEnvelope):
    seq: int = Field(ge=1)


class AcceptedEvent(_Event):
    kind: Literal["accepted"] = "accepted"
    body: AcceptedBody | None = None


class StartedEvent(_Event):
    kind: Literal["started"] = "started"
    body: StartedBody | None = None


class OutputPageEvent(_Event):
    kind: Literal["output_page"] = "output_page"
    body: OutputPageBody | None = None


class InputRequiredEvent(_Event):
    kind: Literal["input_required"] = "input_required"
    body: InputRequiredBody | None = None


class SucceededEvent(_Event):
    kind: Literal["succeeded"] = "succeeded"
    body: SucceededBody | None = None


class FailedEvent(_Event):
    kind: Literal["failed"] = "failed"
    body: FailedBody | None = None


class CancelledEvent(_Event):
    kind: Literal["cancelled"] = "cancelled"
    body: CancelledBody | None = None


class UnknownEvent(_Event):
    kind: Literal["unknown"] = "unknown"
    body: UnknownBody | None = None


class BindingsAnnouncement(_Envelope):
    kind: Literal["bindings"] = "bindings"
    body: BindingsBody | None = None


ExecutionEvent = (
    AcceptedEvent
    | StartedEvent
    | OutputPageEvent
    | InputRequiredEvent
    | SucceededEvent
    | FailedEvent
    | CancelledEvent
    | UnknownEvent
)


class _Batch(_Model):
    """A message that carries several envelopes: its own version and id, no header or body."""

    v: Literal[1] = 1
    message_id: str = Field(default_factory=new_id)

    @field_validator("v", mode="before")
    @classmethod
    def _version_is_an_integer(cls, value: Any) -> Any:
        return _Envelope._version_is_an_integer(value)


class EventBatch(_Batch):
    """Events of one or more executions in one message: what Hands send on ``updates``.

    Each execution's events are a contiguous, ascending seq range (the events of it that were
    ready together), and all of them carry that execution's header. The receiver applies each
    range as a contiguous prefix exactly as it would apply the events one by one (invariant 7).
    """

    kind: Literal["events"] = "events"
    events: list[Annotated[ExecutionEvent, Field(discriminator="kind")]] = Field(min_length=1)

    @model_validator(mode="after")
    def _ranges(self) -> EventBatch:
        last: dict[str, Any] = {}
        for event in self.events:
            before = last.get(event.execution_id)
            if before is not None:
                if event.seq != before.seq + 1:
                    raise ValueError(
                        f"events of execution {event.execution_id} must be one ascending range "
                        f"without gaps: #{event.seq} follows #{before.seq}"
                    )
                if (event.namespace, event.session_id, event.request_digest) != (
                    before.namespace,
                    before.session_id,
                    before.request_digest,
                ):
                    raise ValueError(f"events of execution {event.execution_id} carry different headers")
            last[event.execution_id] = event
        return self


class CommandBatch(_Batch):
    """Commands for one route in one message: what a Brain sends when several intents committed
    together. Each is handled as if it had come alone (its own dedup, ack and dead letter); the
    message is settled once all of them are. One message instead of one per command is what
    saves the broker's and both processes' work per command."""

    kind: Literal["commands"] = "commands"
    commands: list[ExecuteCommand] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_each(self) -> CommandBatch:
        ids = [c.execution_id for c in self.commands]
        if len(set(ids)) != len(ids):
            raise ValueError("a batch carries each execution's command once")
        return self


Control = CancelControl | ReplayControl | ReconcileControl | InputControl
Envelope = Annotated[
    ExecuteCommand
    | CancelControl
    | ReplayControl
    | ReconcileControl
    | InputControl
    | AcceptedEvent
    | StartedEvent
    | OutputPageEvent
    | InputRequiredEvent
    | SucceededEvent
    | FailedEvent
    | CancelledEvent
    | UnknownEvent
    | EventBatch
    | CommandBatch
    | BindingsAnnouncement,
    Field(discriminator="kind"),
]
TERMINAL_EVENT_KINDS = frozenset({"succeeded", "failed", "cancelled"})
