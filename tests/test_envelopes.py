"""Envelopes: every kind round-trips, bad messages are SchemaErrors that say why, digests pin."""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

import protocol
from protocol import (
    PROTOCOL_VERSION,
    TERMINAL_EVENT_KINDS,
    AcceptedBody,
    AcceptedEvent,
    BindingsAnnouncement,
    BindingsBody,
    CancelBody,
    CancelControl,
    CancelledBody,
    CancelledEvent,
    DecodeError,
    ExecuteBody,
    ExecuteCommand,
    FailedBody,
    FailedEvent,
    InputBody,
    InputControl,
    InputRequiredBody,
    InputRequiredEvent,
    ObjectRef,
    OutputPageBody,
    OutputPageEvent,
    ProtocolError,
    ReconcileBody,
    ReconcileControl,
    ReplayBody,
    ReplayControl,
    ReplayPolicy,
    SchemaError,
    StartedBody,
    StartedEvent,
    SucceededBody,
    SucceededEvent,
    ToolBinding,
    UnknownBody,
    UnknownEvent,
    decode,
    encode,
    request_digest,
    with_body,
)

EXECUTION_ID = "exec-0001"
HEADER: dict[str, Any] = {
    "execution_id": EXECUTION_ID,
    "namespace": "acme",
    "session_id": "sess-1",
    "request_digest": "0" * 64,
}


def execute_body(**overrides: Any) -> ExecuteBody:
    fields: dict[str, Any] = {
        "turn_id": "turn-1",
        "call_id": "call-1",
        "route": "payments",
        "tool": "charge_card",
        "binding_digest": "b" * 64,
        "replay_policy": ReplayPolicy.UNSAFE,
        "args": {"amount": 1250, "currency": "EUR", "memo": "héllo", "rate": 0.1},
    }
    fields.update(overrides)
    return ExecuteBody(**fields)


def binding(**overrides: Any) -> ToolBinding:
    fields: dict[str, Any] = {
        "name": "charge_card",
        "version": "1.0.0",
        "route": "payments",
        "description": "Charge a card once.",
        "input_schema": {"type": "object", "properties": {"amount": {"type": "integer"}}},
        "replay_policy": ReplayPolicy.UNSAFE,
        "has_query": True,
    }
    fields.update(overrides)
    return ToolBinding.build(**fields)


# One envelope class and one valid body per kind.
SAMPLES: dict[str, tuple[type[BaseModel], BaseModel, dict[str, Any]]] = {
    "execute": (ExecuteCommand, execute_body(), {}),
    "cancel": (CancelControl, CancelBody(reason="user pressed stop"), {}),
    "replay": (ReplayControl, ReplayBody(from_seq=3), {}),
    "reconcile": (
        ReconcileControl,
        ReconcileBody(
            result={"charge": "ch_1"}, evidence="the provider lists ch_1", actor="ops", request_id="rec-1"
        ),
        {},
    ),
    "input": (
        InputControl,
        InputBody(key="task-1/ab12", decision="answer", answer={"ok": True}, request_id="resp-1"),
        {},
    ),
    "input_required": (
        InputRequiredEvent,
        InputRequiredBody(key="task-1/ab12", message="Refund 5 EUR?", requests={"confirm": {"method": "x"}}),
        {"seq": 3},
    ),
    "accepted": (AcceptedEvent, AcceptedBody(worker="hands-7"), {"seq": 1}),
    "started": (
        StartedEvent,
        StartedBody(attempt=2, worker="hands-7", reason="rerun_after_crash"),
        {"seq": 2},
    ),
    "output_page": (
        OutputPageEvent,
        OutputPageBody(offset=4096, data="partial ✓ output"),
        {"seq": 3},
    ),
    "succeeded": (
        SucceededEvent,
        SucceededBody(result={"charge": "ch_1", "n": [1, 2.5]}, output_bytes=4112),
        {"seq": 4},
    ),
    "failed": (
        FailedEvent,
        FailedBody(error={"code": "declined", "message": "card declined"}, how="rejected"),
        {"seq": 4},
    ),
    "cancelled": (CancelledEvent, CancelledBody(reason="cancel requested"), {"seq": 4}),
    "unknown": (
        UnknownEvent,
        UnknownBody(reason="crashed mid-body; unsafe and no query"),
        {"seq": 4},
    ),
    "bindings": (
        BindingsAnnouncement,
        BindingsBody(route="payments", worker="hands-7", bindings=[binding()]),
        {},
    ),
}
KINDS = sorted(SAMPLES)

REF = ObjectRef(
    uri="s3://tendon-payloads/acme/sess-1/ab",
    sha256="a" * 64,
    size=2_000_000,
    scope="acme/sess-1",
    bound_to=f"{EXECUTION_ID}/execute",
)


def make(
    kind: str, *, body: Any = None, body_ref: ObjectRef | None = None, use_sample_body: bool = True
) -> BaseModel:
    cls, sample_body, extra = SAMPLES[kind]
    fields: dict[str, Any] = dict(extra)
    if cls is not BindingsAnnouncement:
        fields.update(HEADER)
    if body_ref is not None:
        fields["body_ref"] = body_ref
    elif body is not None:
        fields["body"] = body
    elif use_sample_body:
        fields["body"] = sample_body
    return cls(**fields)


def wire(kind: str, **kwargs: Any) -> dict[str, Any]:
    """A valid envelope of ``kind`` as the JSON object it is on the wire."""
    return json.loads(encode(make(kind, **kwargs)))


def schema_error(data: Any) -> str:
    raw = data if isinstance(data, (bytes, str)) else json.dumps(data)
    with pytest.raises(SchemaError) as info:
        decode(raw)
    return str(info.value)


# ---- coverage ----------------------------------------------------------------------------


def test_the_samples_cover_every_kind_in_the_envelope_union():
    union = typing.get_args(protocol.Envelope)[0]
    kinds = {model.model_fields["kind"].default for model in typing.get_args(union)}
    # Batches have no body of their own: their tests are below ("event batches", commands).
    assert kinds == set(SAMPLES) | {"events", "commands"}
    assert TERMINAL_EVENT_KINDS <= kinds


# ---- events made as JSON ----------------------------------------------------------------


EVENT_KINDS = sorted(
    TERMINAL_EVENT_KINDS | {"accepted", "started", "output_page", "input_required", "unknown"}
)


@pytest.mark.parametrize("kind", EVENT_KINDS)
def test_an_event_made_as_json_is_what_its_model_dumps(kind):
    # A worker packs its events without their models (protocol.event_data): each must be
    # exactly what the model would have made of it, whatever the kind.
    _, body, extra = SAMPLES[kind]
    header = {k: HEADER[k] for k in ("namespace", "session_id", "request_digest")}
    made = protocol.event_data(EXECUTION_ID, header, extra["seq"], body)
    model = protocol.event_model(EXECUTION_ID, header, extra["seq"], body)
    assert type(model) is SAMPLES[kind][0]
    assert made == {**model.model_dump(mode="json"), "message_id": made["message_id"]}
    assert decode(protocol.dumps(made)) == model.model_copy(update={"message_id": made["message_id"]})


@pytest.mark.parametrize("trace", [None, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"])
def test_a_command_made_as_json_is_what_its_model_dumps_with_its_request_digest(trace):
    body = SAMPLES["execute"][1]
    made = protocol.execute_data(EXECUTION_ID, "acme", "sess-1", body, trace)
    model = ExecuteCommand(
        execution_id=EXECUTION_ID, namespace="acme", session_id="sess-1",
        request_digest=request_digest(EXECUTION_ID, body), body=body, trace=trace,
        message_id=made["message_id"],
    )  # fmt: skip
    assert made == model.model_dump(mode="json")
    assert decode(protocol.dumps(made)) == model


# ---- event batches -----------------------------------------------------------------------


def event(kind: str, seq: int, execution_id: str = EXECUTION_ID) -> dict[str, Any]:
    """Event ``kind`` of the samples as its wire JSON, with another seq and execution id."""
    return {**wire(kind), "seq": seq, "execution_id": execution_id}


def test_an_event_batch_round_trips_with_ranges_of_several_executions():
    events = [event("accepted", 1), event("started", 2), event("succeeded", 1, "exec-0002")]
    batch = decode(protocol.batch_bytes(events, message_id="m-1"))
    assert isinstance(batch, protocol.EventBatch) and batch.message_id == "m-1"
    assert [(e.execution_id, e.seq, e.kind) for e in batch.events] == [
        (EXECUTION_ID, 1, "accepted"),
        (EXECUTION_ID, 2, "started"),
        ("exec-0002", 1, "succeeded"),
    ]
    assert decode(encode(batch)) == batch


@pytest.mark.parametrize("carried", [False, True])
def test_an_event_batch_is_the_canonical_encoding_of_its_envelope_whether_or_not_its_events_carry_bytes(
    carried,
):
    events = [event("accepted", 1), {**event("succeeded", 2), "body": {"result": {"z": "é ✓", "a": [1]}}}]
    sent = [protocol.Encoded(e) for e in events] if carried else events
    raw = protocol.batch_bytes(sent, message_id="m-é")
    whole = {"v": PROTOCOL_VERSION, "kind": "events", "message_id": "m-é", "events": events}
    assert raw == json.dumps(whole, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert protocol.loads(raw) == whole


@pytest.mark.parametrize(
    ("seqs", "why"),
    [((1, 3), "without gaps: #3 follows #1"), ((2, 1), "#1 follows #2"), ((2, 2), "#2 follows #2")],
)
def test_an_event_batch_whose_execution_range_has_a_gap_or_goes_back_is_a_schema_error(seqs, why):
    raw = protocol.batch_bytes([event("started", seqs[0]), event("started", seqs[1])])
    with pytest.raises(SchemaError, match=why):
        decode(raw)


def test_an_event_batch_whose_range_changes_header_midway_is_a_schema_error():
    other = {**event("started", 2), "session_id": "sess-2"}
    with pytest.raises(SchemaError, match="carry different headers"):
        decode(protocol.batch_bytes([event("accepted", 1), other]))


def test_an_empty_event_batch_or_one_that_carries_a_command_is_a_schema_error():
    with pytest.raises(SchemaError):
        decode(protocol.batch_bytes([]))
    with pytest.raises(SchemaError):
        decode(protocol.batch_bytes([wire("execute")]))


def _execute(execution_id: str) -> bytes:
    return encode(make("execute").model_copy(update={"execution_id": execution_id}))


def test_a_command_batch_round_trips_and_is_the_canonical_encoding_of_its_envelope():
    raw = protocol.command_batch_bytes([_execute("exec-a"), _execute("exec-b")], message_id="m-2")
    batch = decode(raw)
    assert isinstance(batch, protocol.CommandBatch) and batch.message_id == "m-2"
    assert [c.execution_id for c in batch.commands] == ["exec-a", "exec-b"]
    assert all(isinstance(c, ExecuteCommand) and c.body is not None for c in batch.commands)
    assert encode(batch) == raw


def test_a_command_batch_that_is_empty_repeats_an_execution_or_carries_anything_else_is_a_schema_error():
    with pytest.raises(SchemaError):
        decode(protocol.command_batch_bytes([]))
    with pytest.raises(SchemaError, match="each execution's command once"):
        decode(protocol.command_batch_bytes([_execute("exec-a"), _execute("exec-a")]))
    for other in ("cancel", "accepted"):
        with pytest.raises(SchemaError):
            decode(protocol.command_batch_bytes([_execute("exec-a"), encode(make(other))]))


# ---- round trips -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_round_trips_through_encode_and_decode(kind):
    envelope = make(kind)
    raw = encode(envelope)
    decoded = decode(raw)
    assert type(decoded) is type(envelope)
    assert decoded == envelope
    assert decoded.kind == kind
    assert decoded.v == PROTOCOL_VERSION
    assert encode(decoded) == raw  # canonical: decoding and re-encoding changes no byte


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_round_trips_with_a_body_ref_instead_of_a_body(kind):
    envelope = make(kind, body_ref=REF)
    decoded = decode(encode(envelope))
    assert decoded == envelope
    assert decoded.body is None
    assert decoded.body_ref == REF


@pytest.mark.parametrize("kind", KINDS)
def test_the_wire_form_is_canonical_json_with_the_full_header(kind):
    raw = encode(make(kind))
    assert raw == protocol.dumps(json.loads(raw))
    data = json.loads(raw)
    assert data["v"] == PROTOCOL_VERSION and data["kind"] == kind
    assert len(data["message_id"]) == 32
    if kind != "bindings":
        assert data["execution_id"] == EXECUTION_ID
        assert data["request_digest"] == HEADER["request_digest"]


def test_each_envelope_gets_its_own_message_id_and_keeps_it_through_the_wire():
    one, two = make("accepted"), make("accepted")
    assert one.message_id != two.message_id
    assert decode(encode(one)).message_id == one.message_id


def test_the_scope_of_an_execution_envelope_is_namespace_slash_session():
    assert make("execute").scope == "acme/sess-1"


def test_body_bytes_are_the_canonical_json_of_the_body():
    envelope = make("execute")
    assert protocol.body_bytes(envelope) == protocol.dumps(envelope.body.model_dump(mode="json"))
    assert protocol.loads(protocol.body_bytes(envelope)) == json.loads(encode(envelope))["body"]


def test_envelopes_are_immutable():
    envelope = make("execute")
    with pytest.raises(ValidationError):
        envelope.execution_id = "other"


# ---- exactly one of body / body_ref ------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_an_envelope_with_neither_body_nor_body_ref_is_refused(kind):
    with pytest.raises(ValidationError, match="exactly one of body or body_ref"):
        make(kind, use_sample_body=False)
    data = wire(kind)
    data["body"] = None
    assert "exactly one of body or body_ref" in schema_error(data)
    del data["body"]
    assert "exactly one of body or body_ref" in schema_error(data)


@pytest.mark.parametrize("kind", KINDS)
def test_an_envelope_with_both_body_and_body_ref_is_refused(kind):
    data = wire(kind)
    data["body_ref"] = REF.model_dump(mode="json")
    assert "exactly one of body or body_ref" in schema_error(data)


# ---- malformed envelopes -----------------------------------------------------------------


def test_an_unknown_kind_is_a_schema_error_that_names_it_and_the_known_kinds():
    data = wire("execute")
    data["kind"] = "explode"
    message = schema_error(data)
    assert "'explode'" in message
    assert "kind" in message
    assert "'execute'" in message and "'bindings'" in message


def test_a_missing_kind_is_a_schema_error_that_mentions_kind():
    data = wire("execute")
    del data["kind"]
    assert "'kind'" in schema_error(data)


@pytest.mark.parametrize("version", [0, 2, 99, "1", None])
def test_a_wrong_protocol_version_is_a_schema_error(version):
    data = wire("accepted")
    data["v"] = version
    message = schema_error(data)
    assert "accepted.v" in message
    assert "Input should be 1" in message


@pytest.mark.parametrize(
    ("kind", "field"),
    [
        ("execute", "execution_id"),
        ("execute", "namespace"),
        ("execute", "session_id"),
        ("execute", "request_digest"),
        ("accepted", "seq"),
        ("succeeded", "seq"),
        ("replay", "request_digest"),
    ],
)
def test_a_missing_header_field_is_a_schema_error_that_names_the_field(kind, field):
    data = wire(kind)
    del data[field]
    message = schema_error(data)
    assert f"{kind}.{field}" in message
    assert "Field required" in message


@pytest.mark.parametrize(
    ("kind", "field"),
    [
        ("execute", "args"),
        ("execute", "binding_digest"),
        ("accepted", "worker"),
        ("replay", "from_seq"),
        ("unknown", "reason"),
        ("bindings", "route"),
    ],
)
def test_a_missing_body_field_is_a_schema_error_that_names_the_field(kind, field):
    data = wire(kind)
    del data["body"][field]
    message = schema_error(data)
    assert f"{kind}.body.{field}" in message
    assert "Field required" in message


@pytest.mark.parametrize("kind", KINDS)
def test_an_extra_header_field_is_a_schema_error(kind):
    data = wire(kind)
    data["priority"] = "high"
    message = schema_error(data)
    assert f"{kind}.priority" in message
    assert "Extra inputs are not permitted" in message


def test_an_extra_body_field_is_a_schema_error():
    data = wire("execute")
    data["body"]["sudo"] = True
    message = schema_error(data)
    assert "execute.body.sudo" in message
    assert "Extra inputs are not permitted" in message


def test_an_extra_field_in_a_body_ref_is_a_schema_error():
    data = wire("execute", body_ref=REF)
    data["body_ref"]["region"] = "eu"
    assert "body_ref.region" in schema_error(data)


@pytest.mark.parametrize(
    ("kind", "field", "value", "words"),
    [
        ("accepted", "seq", 0, "greater than or equal to 1"),
        ("execute", "request_digest", "abc", "at least 64"),
        ("execute", "execution_id", "", "at least 1"),
        ("execute", "execution_id", 42, "valid string"),
    ],
)
def test_a_header_field_with_a_bad_value_is_a_schema_error_that_says_why(kind, field, value, words):
    data = wire(kind)
    data[field] = value
    message = schema_error(data)
    assert f"{kind}.{field}" in message
    assert words in message


def test_an_unknown_replay_policy_is_a_schema_error():
    data = wire("execute")
    data["body"]["replay_policy"] = "maybe"
    message = schema_error(data)
    assert "execute.body.replay_policy" in message
    assert "'safe'" in message and "'unsafe'" in message


RECONCILE_BODY = {"evidence": "the provider lists ch_1", "actor": "ops", "request_id": "rec-1"}


@pytest.mark.parametrize(
    "outcome", [{"result": None}, {"result": {"charge": "ch_1"}}, {"result": 0}, {"failure": "declined"}]
)
def test_a_reconcile_carries_its_one_outcome_through_the_wire_a_null_result_included(outcome):
    envelope = make("reconcile", body=ReconcileBody(**RECONCILE_BODY, **outcome))
    raw = encode(envelope)
    assert json.loads(raw)["body"] == {**RECONCILE_BODY, **outcome}  # the other key is absent
    decoded = decode(raw)
    assert decoded == envelope and encode(decoded) == raw
    assert decoded.body.succeeded is ("result" in outcome)


@pytest.mark.parametrize(
    "outcome",
    [{}, {"result": 1, "failure": "x"}, {"result": None, "failure": "x"}, {"result": 1, "failure": None},
     {"failure": None}],
    ids=["neither", "both", "null-result-and-failure", "result-and-null-failure", "null-failure"],
)  # fmt: skip
def test_a_reconcile_with_both_or_neither_of_result_and_failure_is_refused(outcome):
    with pytest.raises(ValidationError, match="exactly one of result"):
        ReconcileBody(**RECONCILE_BODY, **outcome)
    data = wire("reconcile")
    data["body"] = {**RECONCILE_BODY, **outcome}
    message = schema_error(data)
    assert "reconcile.body" in message and "exactly one of result (any JSON) or failure" in message


@pytest.mark.parametrize("field", ["evidence", "actor", "request_id"])
def test_a_reconcile_without_evidence_actor_or_request_id_is_refused(field):
    data = wire("reconcile")
    data["body"][field] = ""
    assert f"reconcile.body.{field}" in schema_error(data)
    del data["body"][field]
    assert f"reconcile.body.{field}" in schema_error(data)


@pytest.mark.parametrize("field", ["bound_to", "scope"])
def test_a_body_ref_that_does_not_say_what_it_belongs_to_is_a_schema_error(field):
    data = wire("succeeded", body_ref=REF)
    del data["body_ref"][field]
    message = schema_error(data)
    assert f"body_ref.{field}" in message and "Field required" in message
    data["body_ref"][field] = ""
    assert f"body_ref.{field}" in schema_error(data)


def test_a_body_ref_outside_object_storage_is_a_schema_error():
    data = wire("execute", body_ref=REF)
    data["body_ref"]["uri"] = "http://example.com/payload"
    assert "body_ref.uri" in schema_error(data)


@pytest.mark.parametrize("raw", ["[]", "1", "null", '"execute"'])
def test_json_that_is_not_an_object_is_a_schema_error(raw):
    message = schema_error(raw)
    assert "<root>" in message
    assert "dictionary" in message or "object" in message


def test_schema_errors_start_by_saying_the_envelope_does_not_match_the_protocol():
    data = wire("execute")
    del data["namespace"]
    with pytest.raises(SchemaError) as info:
        decode(json.dumps(data))
    err = info.value
    assert err.message.startswith("envelope does not match the protocol:")
    assert isinstance(err, ProtocolError) and not err.retryable
    assert err.as_dict()["code"] == "schema_error"


def test_decode_goes_through_the_strict_codec():
    raw = encode(make("execute")).decode()
    with pytest.raises(DecodeError, match="duplicate"):
        decode(raw[:-1] + ',"kind":"execute"}')
    with pytest.raises(DecodeError, match="more than one JSON value"):
        decode(raw + raw)
    with pytest.raises(DecodeError, match="precision"):
        decode(raw.replace('"amount":1250', '"amount":9007199254740993'))


def test_escaped_text_decodes_to_the_same_text_and_a_lone_surrogate_is_a_schema_error():
    # decode validates the text it was given (after the strict parse), not a re-encoding of it
    raw = encode(make("execute")).decode()
    escaped = raw.replace('"session_id":"', '"session_id":"\\u00e9\\n\\ud83d\\ude00 ', 1)
    assert decode(escaped).session_id.startswith("\u00e9\n\U0001f600 ")
    with pytest.raises(SchemaError):  # never a UnicodeError out of the consumer's decode
        decode(raw.replace('"session_id":"', '"session_id":"\\ud800', 1))


# ---- with_body ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_with_body_replaces_a_body_ref_with_the_validated_body(kind):
    by_ref = make(kind, body_ref=REF)
    sample_body = SAMPLES[kind][1]
    resolved = with_body(by_ref, sample_body.model_dump(mode="json"))
    assert type(resolved) is type(by_ref)
    assert resolved.body_ref is None
    assert resolved.body == sample_body
    assert type(resolved.body) is type(sample_body)
    assert resolved.message_id == by_ref.message_id
    assert resolved.model_dump(exclude={"body", "body_ref"}) == by_ref.model_dump(
        exclude={"body", "body_ref"}
    )
    assert by_ref.body_ref == REF and by_ref.body is None  # the original is untouched


def test_with_body_accepts_a_body_model_instance():
    resolved = with_body(make("execute", body_ref=REF), execute_body())
    assert resolved.body == execute_body()


def test_with_body_refuses_a_body_missing_a_field():
    body = execute_body().model_dump(mode="json")
    del body["args"]
    with pytest.raises(SchemaError) as info:
        with_body(make("execute", body_ref=REF), body)
    message = str(info.value)
    assert message.startswith("execute body does not match the protocol")
    assert "body.args" in message and "Field required" in message


def test_with_body_refuses_a_body_with_an_extra_field():
    body = {**AcceptedBody(worker="w").model_dump(mode="json"), "sneaky": 1}
    with pytest.raises(SchemaError, match="Extra inputs are not permitted"):
        with_body(make("accepted", body_ref=REF), body)


def test_with_body_refuses_the_body_of_another_kind():
    with pytest.raises(SchemaError, match="execute body does not match"):
        with_body(make("execute", body_ref=REF), CancelBody(reason="x"))
    with pytest.raises(SchemaError, match="accepted body does not match"):
        with_body(make("accepted", body_ref=REF), {"reason": "not an accepted body"})


def test_with_body_refuses_no_body_at_all():
    with pytest.raises(SchemaError, match="exactly one of body or body_ref"):
        with_body(make("execute", body_ref=REF), None)


# ---- request digest ----------------------------------------------------------------------


def test_request_digest_is_stable_for_the_same_command():
    assert request_digest(EXECUTION_ID, execute_body()) == request_digest(EXECUTION_ID, execute_body())
    reordered = execute_body(args={"rate": 0.1, "memo": "héllo", "currency": "EUR", "amount": 1250})
    assert request_digest(EXECUTION_ID, reordered) == request_digest(EXECUTION_ID, execute_body())
    # A replay policy given as its string value is the same command.
    assert request_digest(EXECUTION_ID, execute_body(replay_policy="unsafe")) == request_digest(
        EXECUTION_ID, execute_body()
    )


def test_request_digest_is_the_digest_of_the_canonical_command_and_is_pinned():
    expected = protocol.digest({"execution_id": EXECUTION_ID, **execute_body().model_dump(mode="json")})
    assert request_digest(EXECUTION_ID, execute_body()) == expected
    # Pinned: a change here makes Hands see every redelivered command as a conflict.
    assert expected == "c7411ffc296e90faea87178735196493fbb3ea9b35606f8750dcd5f6dbfb5362"


BODY_CHANGES: dict[str, Any] = {
    "turn_id": "turn-2",
    "call_id": "call-2",
    "route": "refunds",
    "tool": "refund_card",
    "binding_digest": "c" * 64,
    "replay_policy": ReplayPolicy.SAFE,
    "args": {"amount": 1251, "currency": "EUR", "memo": "héllo", "rate": 0.1},
}


def test_the_digest_change_table_covers_every_command_field():
    assert set(BODY_CHANGES) == set(ExecuteBody.model_fields)


@pytest.mark.parametrize("field", sorted(BODY_CHANGES))
def test_request_digest_changes_when_any_command_field_changes(field):
    changed = execute_body(**{field: BODY_CHANGES[field]})
    assert request_digest(EXECUTION_ID, changed) != request_digest(EXECUTION_ID, execute_body())


@pytest.mark.parametrize(
    "args",
    [
        {"amount": 1250, "currency": "EUR", "memo": "héllo"},
        {"amount": 1250, "currency": "EUR", "memo": "héllo", "rate": 0.1, "extra": None},
        {"amount": 1250.5, "currency": "EUR", "memo": "héllo", "rate": 0.1},
        {"amount": "1250", "currency": "EUR", "memo": "héllo", "rate": 0.1},
        {"amount": 1250, "currency": "EUR", "memo": "hello", "rate": 0.1},
    ],
)
def test_request_digest_changes_with_any_change_inside_args(args):
    assert request_digest(EXECUTION_ID, execute_body(args=args)) != request_digest(
        EXECUTION_ID, execute_body()
    )


def test_request_digest_changes_with_the_execution_id():
    assert request_digest("exec-0002", execute_body()) != request_digest(EXECUTION_ID, execute_body())


def test_request_digest_survives_the_wire():
    body = execute_body()
    envelope = ExecuteCommand(**{**HEADER, "request_digest": request_digest(EXECUTION_ID, body)}, body=body)
    decoded = decode(encode(envelope))
    assert request_digest(decoded.execution_id, decoded.body) == decoded.request_digest


# ---- tool binding digest -----------------------------------------------------------------


def test_a_binding_digest_is_stable_and_pins_its_fields():
    one, two = binding(), binding()
    assert one.digest == two.digest
    fields = one.model_dump(exclude={"digest"})
    assert one.digest == ToolBinding.compute_digest(**fields)


def test_a_binding_digest_changes_with_the_replay_policy():
    assert (
        binding(replay_policy=ReplayPolicy.SAFE).digest != binding(replay_policy=ReplayPolicy.UNSAFE).digest
    )
    assert binding(replay_policy="safe").digest == binding(replay_policy=ReplayPolicy.SAFE).digest


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "charge_card_v2"),
        ("version", "1.0.1"),
        ("route", "refunds"),
        ("description", "Charge a card."),
        ("input_schema", {"type": "object"}),
        ("has_query", False),
    ],
)
def test_a_binding_digest_changes_with_every_other_field(field, value):
    assert binding(**{field: value}).digest != binding().digest


def test_a_binding_survives_the_bindings_announcement_round_trip():
    envelope = make("bindings")
    decoded = decode(encode(envelope))
    assert decoded.body.bindings == [binding()]
    assert decoded.body.bindings[0].digest == binding().digest


# ---- hardening: inputs that once slipped through ------------------------------------------


def test_a_binding_can_be_built_relying_on_the_model_defaults():
    built = ToolBinding.build(
        name="t", version="1", route="r", input_schema={}, replay_policy=ReplayPolicy.SAFE
    )
    assert built.description == "" and built.has_query is False


def test_an_envelope_without_a_protocol_version_is_a_schema_error():
    data = wire("accepted")
    del data["v"]
    assert "v" in schema_error(data)


@pytest.mark.parametrize(("field", "value"), [("v", True), ("v", 1.0), ("seq", "5"), ("seq", 5.0)])
def test_a_header_value_of_the_wrong_json_type_is_a_schema_error(field, value):
    data = wire("accepted")
    data[field] = value
    assert field in schema_error(data)
