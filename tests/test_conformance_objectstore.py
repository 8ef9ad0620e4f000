"""One object-store contract, run against S3 (moto's server) and a directory on disk.

Invariant 9 on both backends of issue 3: payloads are stored once per scope, message and
content, and ``get`` refuses anything it can't verify (scope, binding, location, size, sha256)
before handing out a single byte. No mocks: the S3 side talks HTTP to a real S3 API server.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest

from infra.objects.directory import DirectoryObjectStore
from infra.objects.keys import (
    check_binding,  # the one binding rule
    check_scope,  # the one scope rule
    object_binding,
)
from infra.objects.payloads import ObjectStore, PayloadCodec
from protocol import (
    ExecuteBody,
    ExecuteCommand,
    ObjectRef,
    ObjectRefError,
    SucceededBody,
    SucceededEvent,
    decode,
    encode,
)


@dataclass
class Backend:
    """An opened store, and how to reach behind its back to damage what it stored."""

    name: str
    store: ObjectStore
    scheme: str
    overwrite: Callable[[ObjectRef, bytes], object]
    delete: Callable[[ObjectRef], object]


def _local_path(ref: ObjectRef) -> Path:
    return Path(unquote(urlparse(ref.uri).path))


@pytest.fixture
async def directory_store(tmp_path: Path) -> AsyncIterator[DirectoryObjectStore]:
    async with DirectoryObjectStore(tmp_path / "objects") as store:
        yield store


@pytest.fixture(params=["s3", "directory"])
def backend(request: pytest.FixtureRequest) -> Backend:
    # A plain fixture that picks the async one by name: only the S3 case needs its server.
    if request.param == "directory":
        return Backend(
            "directory",
            request.getfixturevalue("directory_store"),
            "file",
            lambda ref, data: _local_path(ref).write_bytes(data),
            lambda ref: _local_path(ref).unlink(),
        )
    s3_server = request.getfixturevalue("s3_server")

    def key(ref: ObjectRef) -> str:
        return ref.uri.removeprefix(f"s3://{s3_server.bucket}/")

    def with_client(action: Callable[[Any], object]) -> None:
        client = s3_server.client()
        try:
            action(client)
        finally:
            client.close()

    return Backend(
        "s3",
        request.getfixturevalue("object_store"),
        "s3",
        lambda ref, data: with_client(
            lambda c: c.put_object(Bucket=s3_server.bucket, Key=key(ref), Body=data)
        ),
        lambda ref: with_client(lambda c: c.delete_object(Bucket=s3_server.bucket, Key=key(ref))),
    )


def _scope() -> str:
    # A fresh session per test: the S3 server and its bucket live for the whole test session.
    return f"tests/{uuid.uuid4().hex}"


def _bound(kind: str = "succeeded", seq: int | None = 3, execution_id: str | None = None) -> str:
    """The binding of one message of a fresh execution (or of ``execution_id``)."""
    execution_id = execution_id or uuid.uuid4().hex
    return "/".join([execution_id, kind] + ([] if seq is None else [str(seq)]))


async def test_a_payload_round_trips_under_a_content_addressed_ref(backend: Backend) -> None:
    scope, data = _scope(), b'{"hello": "world"}' * 100
    execution_id = uuid.uuid4().hex
    bound = _bound("succeeded", 3, execution_id)
    ref = await backend.store.put(scope, bound, data)
    digest = hashlib.sha256(data).hexdigest()
    assert (ref.sha256, ref.size, ref.scope, ref.bound_to) == (digest, len(data), scope, bound)
    assert ref.uri.startswith(f"{backend.scheme}://")
    assert ref.uri.endswith(f"/{scope}/{execution_id}/succeeded-3/sha256/{digest}")
    assert await backend.store.get(ref, expected_scope=scope, expected_binding=bound) == data


async def test_a_command_payload_is_keyed_by_its_execution_and_kind(backend: Backend) -> None:
    scope, execution_id = _scope(), uuid.uuid4().hex
    bound = _bound("execute", None, execution_id)
    ref = await backend.store.put(scope, bound, b'{"args": {}}')
    assert ref.uri.endswith(f"/{scope}/{execution_id}/execute/sha256/{ref.sha256}")
    assert await backend.store.get(ref, expected_scope=scope, expected_binding=bound) == b'{"args": {}}'


async def test_an_empty_payload_round_trips(backend: Backend) -> None:
    scope, bound = _scope(), _bound()
    ref = await backend.store.put(scope, bound, b"")
    assert await backend.store.get(ref, expected_scope=scope, expected_binding=bound) == b""


async def test_the_same_content_gets_the_same_ref_and_another_scope_or_message_another_ref(
    backend: Backend,
) -> None:
    scope, other, bound = _scope(), _scope(), _bound()
    first = await backend.store.put(scope, bound, b"same bytes")
    assert await backend.store.put(scope, bound, b"same bytes") == first
    elsewhere = await backend.store.put(other, bound, b"same bytes")
    assert elsewhere.uri != first.uri and elsewhere.sha256 == first.sha256
    sibling = await backend.store.put(scope, _bound(), b"same bytes")
    assert sibling.uri != first.uri and sibling.sha256 == first.sha256


async def test_a_ref_is_refused_for_any_other_scope(backend: Backend) -> None:
    scope, bound = _scope(), _bound()
    ref = await backend.store.put(scope, bound, b"private")
    with pytest.raises(ObjectRefError, match="does not match expected"):
        await backend.store.get(ref, expected_scope=_scope(), expected_binding=bound)


async def test_a_ref_written_for_another_execution_of_the_same_session_is_refused(backend: Backend) -> None:
    # Given a real, intact object of execution A (same session as B, right sha256 and size)
    scope, a, b = _scope(), _bound("succeeded", 3), _bound("succeeded", 3)
    ref = await backend.store.put(scope, a, b'{"result": "for A"}')
    # When B's succeeded #3 offers it as its body, Then it is refused, naming both bindings
    with pytest.raises(ObjectRefError) as refused:
        await backend.store.get(ref, expected_scope=scope, expected_binding=b)
    assert str(refused.value) == f"object ref bound_to {a!r} does not match expected {b!r}"


async def test_a_ref_claiming_this_execution_but_pointing_at_anothers_object_is_refused(
    backend: Backend,
) -> None:
    # Given execution A's real object, and a ref that says "B's succeeded #3" but keeps A's uri
    scope, a, b = _scope(), _bound("succeeded", 3), _bound("succeeded", 3)
    stored = await backend.store.put(scope, a, b'{"result": "for A"}')
    forged = stored.model_copy(update={"bound_to": b})
    # Then the store, which derives the key from the binding, refuses the uri
    with pytest.raises(ObjectRefError, match="uri .* does not match"):
        await backend.store.get(forged, expected_scope=scope, expected_binding=b)


@pytest.mark.parametrize(
    ("kind", "seq", "other_kind", "other_seq"),
    [
        ("succeeded", 3, "succeeded", 4),
        ("succeeded", 3, "failed", 3),
        ("output_page", 2, "succeeded", 2),
        ("execute", None, "cancel", None),
        ("execute", None, "succeeded", 3),
    ],
)
async def test_a_ref_written_for_another_message_of_the_same_execution_is_refused(
    backend: Backend, kind: str, seq: int | None, other_kind: str, other_seq: int | None
) -> None:
    scope, execution_id = _scope(), uuid.uuid4().hex
    written_for = _bound(kind, seq, execution_id)
    expected = _bound(other_kind, other_seq, execution_id)
    ref = await backend.store.put(scope, written_for, b"a body of one message")
    with pytest.raises(ObjectRefError, match="bound_to .* does not match expected"):
        await backend.store.get(ref, expected_scope=scope, expected_binding=expected)
    # Nor does relabelling the ref get it past the key the store derives from the binding
    relabelled = ref.model_copy(update={"bound_to": expected})
    with pytest.raises(ObjectRefError, match="uri .* does not match"):
        await backend.store.get(relabelled, expected_scope=scope, expected_binding=expected)


async def test_a_tampered_object_of_the_same_size_is_refused(backend: Backend) -> None:
    scope, bound = _scope(), _bound()
    ref = await backend.store.put(scope, bound, b"original")
    backend.overwrite(ref, b"ORIGINAL")
    with pytest.raises(ObjectRefError, match="sha256 mismatch"):
        await backend.store.get(ref, expected_scope=scope, expected_binding=bound)


async def test_a_tampered_object_of_another_size_is_refused(backend: Backend) -> None:
    scope, bound = _scope(), _bound()
    ref = await backend.store.put(scope, bound, b"original")
    backend.overwrite(ref, b"much longer than the original" * 1000)
    with pytest.raises(ObjectRefError, match="sha256 mismatch"):
        await backend.store.get(ref, expected_scope=scope, expected_binding=bound)


async def test_putting_the_content_again_repairs_a_damaged_object(backend: Backend) -> None:
    scope, bound = _scope(), _bound()
    ref = await backend.store.put(scope, bound, b"original")
    backend.overwrite(ref, b"truncated")
    assert await backend.store.put(scope, bound, b"original") == ref
    assert await backend.store.get(ref, expected_scope=scope, expected_binding=bound) == b"original"


async def test_a_missing_object_is_refused(backend: Backend) -> None:
    scope, bound = _scope(), _bound()
    ref = await backend.store.put(scope, bound, b"soon gone")
    backend.delete(ref)
    with pytest.raises(ObjectRefError, match="is missing"):
        await backend.store.get(ref, expected_scope=scope, expected_binding=bound)


async def test_a_ref_whose_uri_points_at_another_scope_is_refused(backend: Backend) -> None:
    # The attacker's session stored the bytes; the forged ref claims the victim's scope.
    theirs, victim, bound = _scope(), _scope(), _bound()
    stored = await backend.store.put(theirs, bound, b"not yours")
    forged = stored.model_copy(update={"scope": victim})
    with pytest.raises(ObjectRefError, match="uri .* does not match"):
        await backend.store.get(forged, expected_scope=victim, expected_binding=bound)


@pytest.mark.parametrize(
    "uri", ["{scheme}:///etc/passwd", "{scheme}://elsewhere/{key}", "{uri}/../{sha}", "{uri}?x=1"]
)
async def test_a_ref_whose_uri_is_not_exactly_the_stores_own_is_refused(backend: Backend, uri: str) -> None:
    scope, execution_id = _scope(), uuid.uuid4().hex
    bound = _bound("succeeded", 3, execution_id)
    ref = await backend.store.put(scope, bound, b"payload")
    key = f"{scope}/{execution_id}/succeeded-3/sha256/{ref.sha256}"
    forged = ref.model_copy(
        update={"uri": uri.format(scheme=backend.scheme, key=key, uri=ref.uri, sha=ref.sha256)}
    )
    with pytest.raises(ObjectRefError, match="uri .* does not match"):
        await backend.store.get(forged, expected_scope=scope, expected_binding=bound)


@pytest.mark.parametrize("scope", ["", "one", "a/b/c", "../x", "a/..", "./b", "a b/c", "a/b\n"])
async def test_an_invalid_scope_is_refused_with_the_same_words_everywhere(
    backend: Backend, scope: str
) -> None:
    bound = _bound()
    with pytest.raises(ObjectRefError) as reference:
        check_scope(scope)
    with pytest.raises(ObjectRefError) as put:
        await backend.store.put(scope, bound, b"x")
    assert str(put.value) == str(reference.value)
    ref = ObjectRef(uri=f"{backend.scheme}://x", sha256="0" * 64, size=1, scope=scope or "?", bound_to=bound)
    with pytest.raises(ObjectRefError) as get:
        await backend.store.get(ref, expected_scope=scope or "?", expected_binding=bound)
    assert str(get.value).startswith("invalid object scope")


@pytest.mark.parametrize(
    "bound",
    [
        "",
        "exe",
        "exe/",
        "/succeeded/1",
        "exe/succeeded/1/extra",
        "../succeeded/1",
        "./execute",
        "exe/../1",
        "exe/succeeded/0",
        "exe/succeeded/01",
        "exe/succeeded/-1",
        "exe/output-page/1",
        "e xe/execute",
        "exe\\x/execute",
        "exe/execute\n",
        "exé/execute",
    ],
)
async def test_an_invalid_binding_is_refused_with_the_same_words_everywhere(
    backend: Backend, bound: str
) -> None:
    # Execution ids come from messages: a binding never smuggles a path into a key.
    scope = _scope()
    with pytest.raises(ObjectRefError) as reference:
        check_binding(bound)
    assert str(reference.value).startswith("invalid object binding")
    with pytest.raises(ObjectRefError) as put:
        await backend.store.put(scope, bound, b"x")
    assert str(put.value) == str(reference.value)
    ref = ObjectRef(uri=f"{backend.scheme}://x", sha256="0" * 64, size=1, scope=scope, bound_to=bound or "?")
    with pytest.raises(ObjectRefError) as get:
        await backend.store.get(ref, expected_scope=scope, expected_binding=bound or "?")
    assert str(get.value).startswith("invalid object binding")


# ---- the codec: what an envelope's header expects of its body_ref -------------------------

THRESHOLD = 512  # every body below is bigger: the codec offloads it
BIG = {"blob": "r" * 2_000}


def _succeeded(scope: str, execution_id: str, seq: int = 3, **fields: object) -> SucceededEvent:
    namespace, session_id = scope.split("/")
    fields.setdefault("body", SucceededBody(result=BIG))
    return SucceededEvent(
        execution_id=execution_id,
        namespace=namespace,
        session_id=session_id,
        request_digest=hashlib.sha256(execution_id.encode()).hexdigest(),
        seq=seq,
        **fields,  # type: ignore[arg-type]
    )


async def test_the_codec_binds_an_offloaded_body_to_its_message_and_resolves_it(backend: Backend) -> None:
    codec = PayloadCodec(backend.store, THRESHOLD)
    event = _succeeded(_scope(), uuid.uuid4().hex)
    raw = await codec.pack(event)
    ref = decode(raw).body_ref
    assert ref is not None and ref.bound_to == f"{event.execution_id}/succeeded/3" == object_binding(event)
    assert (await codec.unpack(raw)).body.result == BIG


async def test_the_codec_binds_an_offloaded_command_to_its_execution_and_kind(backend: Backend) -> None:
    codec = PayloadCodec(backend.store, THRESHOLD)
    body = ExecuteBody(
        turn_id="t", call_id="c", route="r", tool="t", binding_digest="d", replay_policy="safe", args=BIG
    )
    execution_id = uuid.uuid4().hex
    command = ExecuteCommand(
        execution_id=execution_id,
        namespace="tests",
        session_id=uuid.uuid4().hex,
        request_digest="0" * 64,
        body=body,
    )
    raw = await codec.pack(command)
    assert decode(raw).body_ref.bound_to == f"{execution_id}/execute"
    assert (await codec.unpack(raw)).body == body


async def test_the_codec_refuses_an_event_whose_body_ref_was_written_for_a_sibling_execution(
    backend: Backend,
) -> None:
    # Given execution A's succeeded #3, offloaded: a real object with the right sha256 and size
    codec = PayloadCodec(backend.store, THRESHOLD)
    scope, a, b = _scope(), uuid.uuid4().hex, uuid.uuid4().hex
    a_ref = decode(await codec.pack(_succeeded(scope, a))).body_ref
    assert a_ref is not None
    # When execution B of the same session sends a succeeded #3 whose body_ref is A's object
    forged = encode(_succeeded(scope, b, body=None, body_ref=a_ref))
    # Then it does not resolve: the ref was written for another execution
    with pytest.raises(ObjectRefError) as refused:
        await codec.unpack(forged)
    assert str(refused.value) == (
        f"object ref bound_to '{a}/succeeded/3' does not match expected '{b}/succeeded/3'"
    )
    # Nor does relabelling the ref help: its uri still names A's object
    relabelled = a_ref.model_copy(update={"bound_to": f"{b}/succeeded/3"})
    with pytest.raises(ObjectRefError, match="uri .* does not match"):
        await codec.unpack(encode(_succeeded(scope, b, body=None, body_ref=relabelled)))


async def test_the_codec_refuses_an_event_whose_body_ref_was_written_for_another_event_of_it(
    backend: Backend,
) -> None:
    codec = PayloadCodec(backend.store, THRESHOLD)
    scope, execution_id = _scope(), uuid.uuid4().hex
    ref = decode(await codec.pack(_succeeded(scope, execution_id, seq=3))).body_ref
    with pytest.raises(ObjectRefError, match="bound_to .* does not match expected '.*/succeeded/4'"):
        await codec.unpack(encode(_succeeded(scope, execution_id, seq=4, body=None, body_ref=ref)))


async def test_the_codec_refuses_a_body_ref_on_an_execution_id_that_is_no_key_segment(
    backend: Backend,
) -> None:
    codec = PayloadCodec(backend.store, THRESHOLD)
    scope = _scope()
    ref = decode(await codec.pack(_succeeded(scope, uuid.uuid4().hex))).body_ref
    for execution_id in ["../x", "a/b", "."]:
        with pytest.raises(ObjectRefError, match="invalid object binding"):
            await codec.unpack(encode(_succeeded(scope, execution_id, body=None, body_ref=ref)))
        with pytest.raises(ObjectRefError, match="invalid object binding"):
            await codec.pack(_succeeded(scope, execution_id))
