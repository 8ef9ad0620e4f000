"""Every message on the broker is one of these envelopes.

An envelope has a fixed header (protocol version, message id, kind, execution id,
namespace and session for scoping, request digest, seq where it applies) and either an
inline ``body`` or a ``body_ref`` pointing at the same body stored in S3.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from protocol import codec
from protocol.bindings import ReplayPolicy, ToolBinding
from protocol.errors import SchemaError

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
    | SucceededEvent
    | FailedEvent
    | CancelledEvent
    | UnknownEvent
)


# Each event's kind and model by the type of its body.
_EVENTS_BY_BODY: dict[type, tuple[str, Callable[..., _Event]]] = {
    next(a for a in get_args(cls.model_fields["body"].annotation) if a is not type(None)): (
        cls.model_fields["kind"].default,
        cls,
    )
    for cls in get_args(ExecutionEvent)
}


def event_model(execution_id: str, header: Mapping[str, str], seq: int, body: BaseModel) -> _Event:
    """The event that carries ``body`` as event ``seq`` of ``execution_id`` (``header``: the
    execution's namespace, session_id and request_digest)."""
    return _EVENTS_BY_BODY[type(body)][1](execution_id=execution_id, **header, seq=seq, body=body)


def event_data(execution_id: str, header: Mapping[str, str], seq: int, body: BaseModel) -> dict[str, Any]:
    """What ``event_model(...).model_dump(mode="json")`` is, made without the model: for a
    worker's own events, whose header it took from a command it validated and whose body is a
    model already (the event's model and its dump took 5 of the 9 us of packing one). Whoever
    receives it validates the whole, as always."""
    return {
        "v": PROTOCOL_VERSION, "message_id": new_id(), "body_ref": None, "execution_id": execution_id,
        "namespace": header["namespace"], "session_id": header["session_id"],
        "request_digest": header["request_digest"], "seq": seq, "kind": _EVENTS_BY_BODY[type(body)][0],
        "body": body.model_dump(mode="json"),
    }  # fmt: skip


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


Control = CancelControl | ReplayControl
Envelope = Annotated[
    ExecuteCommand
    | CancelControl
    | ReplayControl
    | AcceptedEvent
    | StartedEvent
    | OutputPageEvent
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

_ENVELOPE: TypeAdapter[Any] = TypeAdapter(Envelope)


def request_digest(execution_id: str, body: ExecuteBody) -> str:
    """sha256 of the canonical command: what Hands compare on redelivery."""
    return codec.digest({"execution_id": execution_id, **body.model_dump(mode="json")})


def execute_data(
    execution_id: str, namespace: str, session_id: str, body: ExecuteBody, trace: str | None = None
) -> dict[str, Any]:
    """What the ``ExecuteCommand`` of ``body`` dumps as JSON, its request digest made from the same
    dump of the body, without the command's model (as :func:`event_data` makes an event): for a
    Brain's own commands, whose header is a turn's it holds and whose body is a model already."""
    body_data = body.model_dump(mode="json")
    data = {
        "v": PROTOCOL_VERSION, "message_id": new_id(), "body_ref": None, "execution_id": execution_id,
        "namespace": namespace, "session_id": session_id, "kind": "execute", "body": body_data,
        "request_digest": codec.digest({"execution_id": execution_id, **body_data}),
    }  # fmt: skip
    if trace is not None:
        data["trace"] = trace
    return data


def encode(envelope: BaseModel) -> bytes:
    """The one way to put an envelope on the wire."""
    return codec.dumps(envelope.model_dump(mode="json"))


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def decode(raw: bytes | str) -> Any:
    """Strictly decode one envelope; its body may still be a ``body_ref`` to resolve."""
    data = codec.loads(raw)
    if isinstance(data, dict) and "v" not in data:
        raise SchemaError("v: every envelope must carry its protocol version `v`")
    try:
        # The same text, which the strict parse above found clean, validated in strict JSON mode
        # (no silent "5" -> 5 coercions of header fields). Parsed once more, in pydantic's Rust
        # parser: 7 us for a two-event batch, where encoding ``data`` again first cost 15 more.
        return _ENVELOPE.validate_json(raw, strict=True)
    except ValidationError as exc:
        raise SchemaError(f"envelope does not match the protocol: {_describe(exc)}") from exc


def with_body(envelope: Any, body: Any) -> Any:
    """Return ``envelope`` with its ``body_ref`` replaced by the (validated) ``body``."""
    data = envelope.model_dump(mode="json")
    data["body_ref"] = None
    data["body"] = body.model_dump(mode="json") if isinstance(body, BaseModel) else body
    try:
        return type(envelope).model_validate_json(codec.dumps(data), strict=True)
    except ValidationError as exc:
        raise SchemaError(f"{envelope.kind} body does not match the protocol: {_describe(exc)}") from exc


def batch_bytes(events: list[dict[str, Any]], message_id: str | None = None) -> bytes:
    """The wire form of an ``EventBatch`` of events already in their JSON form (each one what
    ``encode`` made of an event, or a copy of it kept in a ledger): no model is rebuilt to send
    them again, nor an event encoded again that carries its bytes (``codec.Encoded``). The
    receiver validates the whole batch as usual."""
    rest = codec.dumps({"v": PROTOCOL_VERSION, "kind": "events", "message_id": message_id or new_id()})
    # Canonical order: "events" sorts first, so it is spliced in ahead of the other keys.
    return b'{"events":' + codec.dumps(events) + b"," + rest[1:]


def command_batch_bytes(commands: list[bytes], message_id: str | None = None) -> bytes:
    """The wire form of a ``CommandBatch`` of commands already encoded (as their execution rows
    keep them): spliced, not decoded and encoded again. The receiver validates it as usual."""
    rest = codec.dumps({"v": PROTOCOL_VERSION, "kind": "commands", "message_id": message_id or new_id()})
    # Canonical order: "commands" sorts first, so it is spliced in ahead of the other keys.
    return b'{"commands":[' + b",".join(commands) + b"]," + rest[1:]


def body_bytes(envelope: Any) -> bytes:
    """Canonical bytes of an inline body (what gets offloaded when it is too big)."""
    return codec.dumps(envelope.body.model_dump(mode="json"))
