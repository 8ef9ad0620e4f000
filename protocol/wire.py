"""Envelopes to and from the wire: the one encode and strict decode, request digests, and the
JSON forms a process makes of its own messages without their models (events, commands, batches
spliced from parts already encoded). Whatever is made here, the receiver validates whole with
:func:`decode`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, get_args

from pydantic import BaseModel, TypeAdapter, ValidationError

from protocol import codec
from protocol.envelopes import PROTOCOL_VERSION, Envelope, ExecuteBody, ExecutionEvent, new_id
from protocol.errors import SchemaError

_ENVELOPE: TypeAdapter[Any] = TypeAdapter(Envelope)

# Each event's kind and model by the type of its body.
_EVENTS_BY_BODY: dict[type, tuple[str, Callable[..., Any]]] = {
    next(a for a in get_args(cls.model_fields["body"].annotation) if a is not type(None)): (
        cls.model_fields["kind"].default,
        cls,
    )
    for cls in get_args(ExecutionEvent)
}


def event_model(execution_id: str, header: Mapping[str, str], seq: int, body: BaseModel) -> BaseModel:
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


def request_digest(execution_id: str, body: ExecuteBody) -> str:
    """sha256 of the canonical command: what Hands compare on redelivery."""
    return _digest(execution_id, body.model_dump(mode="json"))


def _digest(execution_id: str, body_data: dict[str, Any]) -> str:
    return codec.digest({"execution_id": execution_id, **body_data})


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
        "request_digest": _digest(execution_id, body_data),
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
