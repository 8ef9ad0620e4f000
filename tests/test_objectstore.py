"""The S3 object store against a real S3 HTTP endpoint (moto's server), no mocks.

Invariant 9: big envelopes travel by reference under an immutable, scoped, bound,
content-addressed key, and the receiver verifies sha256, scope and binding before it uses (or
acks) anything.
"""

from __future__ import annotations

import hashlib
import os
import uuid

import pytest

from infra.objects.s3 import S3ObjectStore
from protocol import ObjectRef, ObjectRefError, TransientError

EXECUTION = "e" + uuid.uuid4().hex
BOUND = f"{EXECUTION}/succeeded/3"  # what every object here is written for, unless a test says
KEY_PART = f"{EXECUTION}/succeeded-3"  # the same binding as a part of the object's key


def _scope() -> str:
    # A fresh session per test: the server lives for the whole session and keys are shared.
    return f"tests/{uuid.uuid4().hex}"


def _keys(s3_server, scope: str) -> list[str]:
    client = s3_server.client()
    try:
        listed = client.list_objects_v2(Bucket=s3_server.bucket, Prefix=f"{scope}/")
        return [item["Key"] for item in listed.get("Contents", [])]
    finally:
        client.close()


def _overwrite(s3_server, ref: ObjectRef, data: bytes) -> None:
    key = ref.uri.removeprefix(f"s3://{s3_server.bucket}/")
    client = s3_server.client()
    try:
        client.put_object(Bucket=s3_server.bucket, Key=key, Body=data)
    finally:
        client.close()


async def test_a_small_payload_round_trips(object_store: S3ObjectStore, s3_server) -> None:
    scope = _scope()
    data = b'{"hello": "world"}'
    ref = await object_store.put(scope, BOUND, data)
    digest = hashlib.sha256(data).hexdigest()
    assert ref == ObjectRef(
        uri=f"s3://{s3_server.bucket}/{scope}/{KEY_PART}/sha256/{digest}",
        sha256=digest,
        size=len(data),
        scope=scope,
        bound_to=BOUND,
    )
    assert await object_store.get(ref, expected_scope=scope, expected_binding=BOUND) == data


async def test_an_empty_payload_round_trips(object_store: S3ObjectStore) -> None:
    scope = _scope()
    ref = await object_store.put(scope, BOUND, b"")
    assert ref.size == 0
    assert await object_store.get(ref, expected_scope=scope, expected_binding=BOUND) == b""


async def test_a_two_mebibyte_payload_round_trips(object_store: S3ObjectStore) -> None:
    scope = _scope()
    data = os.urandom(2 * 1024 * 1024 + 17)
    ref = await object_store.put(scope, BOUND, data)
    assert ref.size == len(data)
    assert await object_store.get(ref, expected_scope=scope, expected_binding=BOUND) == data


async def test_a_payload_above_the_multipart_threshold_round_trips(
    object_store: S3ObjectStore,
) -> None:
    scope = _scope()
    data = os.urandom(9 * 1024 * 1024 + 3)  # above 8 MiB: uploaded in parts
    ref = await object_store.put(scope, BOUND, data)
    assert await object_store.get(ref, expected_scope=scope, expected_binding=BOUND) == data


async def test_the_same_content_twice_gives_the_same_ref_and_one_object(
    object_store: S3ObjectStore, s3_server
) -> None:
    scope = _scope()
    first = await object_store.put(scope, BOUND, b"same bytes")
    second = await object_store.put(scope, BOUND, b"same bytes")
    assert first == second
    assert _keys(s3_server, scope) == [f"{scope}/{KEY_PART}/sha256/{first.sha256}"]


async def test_the_same_content_for_two_executions_of_a_session_gives_two_bound_objects(
    object_store: S3ObjectStore, s3_server
) -> None:
    scope, other = _scope(), "e" + uuid.uuid4().hex
    mine = await object_store.put(scope, BOUND, b"same bytes")
    theirs = await object_store.put(scope, f"{other}/succeeded/3", b"same bytes")
    assert mine.sha256 == theirs.sha256 and mine.uri != theirs.uri
    assert sorted(_keys(s3_server, scope)) == sorted(
        [f"{scope}/{KEY_PART}/sha256/{mine.sha256}", f"{scope}/{other}/succeeded-3/sha256/{mine.sha256}"]
    )


async def test_an_existing_object_is_not_rewritten(object_store: S3ObjectStore, s3_server) -> None:
    scope = _scope()
    ref = await object_store.put(scope, BOUND, b"immutable")
    client = s3_server.client()
    try:
        key = ref.uri.removeprefix(f"s3://{s3_server.bucket}/")
        before = client.head_object(Bucket=s3_server.bucket, Key=key)["ETag"]
        await object_store.put(scope, BOUND, b"immutable")
        after = client.head_object(Bucket=s3_server.bucket, Key=key)
        assert after["ETag"] == before
    finally:
        client.close()


async def test_the_same_content_in_two_sessions_gives_two_scoped_objects(
    object_store: S3ObjectStore,
) -> None:
    one, two = _scope(), _scope()
    ref_one = await object_store.put(one, BOUND, b"shared")
    ref_two = await object_store.put(two, BOUND, b"shared")
    assert ref_one.sha256 == ref_two.sha256
    assert ref_one.uri != ref_two.uri
    assert await object_store.get(ref_two, expected_scope=two, expected_binding=BOUND) == b"shared"


async def test_a_wrong_expected_scope_is_refused(object_store: S3ObjectStore) -> None:
    scope = _scope()
    ref = await object_store.put(scope, BOUND, b"private")
    with pytest.raises(ObjectRefError, match="does not match expected"):
        await object_store.get(ref, expected_scope=_scope(), expected_binding=BOUND)


async def test_a_tampered_object_is_refused(object_store: S3ObjectStore, s3_server) -> None:
    scope = _scope()
    ref = await object_store.put(scope, BOUND, b"original payload")
    _overwrite(s3_server, ref, b"tampered payload")  # same length, different bytes
    with pytest.raises(ObjectRefError, match="sha256 mismatch"):
        await object_store.get(ref, expected_scope=scope, expected_binding=BOUND)


async def test_a_tampered_object_of_another_size_is_refused(object_store: S3ObjectStore, s3_server) -> None:
    scope = _scope()
    ref = await object_store.put(scope, BOUND, b"original payload")
    _overwrite(s3_server, ref, b"x" * 1000)
    with pytest.raises(ObjectRefError, match="sha256 mismatch"):
        await object_store.get(ref, expected_scope=scope, expected_binding=BOUND)


async def test_a_missing_object_is_refused(object_store: S3ObjectStore, s3_server) -> None:
    scope = _scope()
    digest = hashlib.sha256(b"never stored").hexdigest()
    ref = ObjectRef(
        uri=f"s3://{s3_server.bucket}/{scope}/{KEY_PART}/sha256/{digest}",
        sha256=digest,
        size=12,
        scope=scope,
        bound_to=BOUND,
    )
    with pytest.raises(ObjectRefError, match="is missing"):
        await object_store.get(ref, expected_scope=scope, expected_binding=BOUND)


@pytest.mark.parametrize(
    "mangle",
    [
        pytest.param(lambda ref, other: ref.uri.replace(ref.sha256, other.sha256), id="digest"),
        pytest.param(lambda ref, other: ref.uri.replace(ref.scope, other.scope), id="other-scope"),
        pytest.param(lambda ref, other: ref.uri.replace(EXECUTION, "e" + "0" * 32), id="other-execution"),
        pytest.param(lambda ref, other: ref.uri.replace("/succeeded-3/", "/succeeded-4/"), id="other-seq"),
        pytest.param(lambda ref, other: ref.uri.replace(f"/{KEY_PART}/", "/"), id="unbound-layout"),
        pytest.param(lambda ref, other: ref.uri.replace("s3://", "s3://elsewhere-"), id="bucket"),
        pytest.param(lambda ref, other: ref.uri.replace("/sha256/", "/md5/"), id="layout"),
        pytest.param(lambda ref, other: ref.uri.replace("s3://", "file://"), id="scheme"),
        pytest.param(lambda ref, other: ref.uri + "/../x", id="suffix"),
    ],
)
async def test_a_ref_whose_uri_does_not_match_its_scope_binding_and_sha256_is_refused(
    object_store: S3ObjectStore, mangle
) -> None:
    scope, other_scope = _scope(), _scope()
    ref = await object_store.put(scope, BOUND, b"mine")
    other = await object_store.put(other_scope, BOUND, b"theirs")
    # The uri points at a real, intact object, but not at the one the ref's fields describe.
    forged = ref.model_copy(update={"uri": mangle(ref, other)})
    with pytest.raises(ObjectRefError, match="does not match s3://"):
        await object_store.get(forged, expected_scope=scope, expected_binding=BOUND)


async def test_a_ref_claiming_our_scope_for_another_sessions_object_is_refused(
    object_store: S3ObjectStore,
) -> None:
    mine, theirs = _scope(), _scope()
    ref = await object_store.put(theirs, BOUND, b"their secret")
    forged = ref.model_copy(update={"scope": mine})  # uri still points into their session
    with pytest.raises(ObjectRefError):
        await object_store.get(forged, expected_scope=mine, expected_binding=BOUND)


@pytest.mark.parametrize(
    "scope",
    [
        "",
        "ns",
        "ns/",
        "/session",
        "ns/session/extra",
        "ns/sess ion",
        "ns/sess\n",
        "../x",
        "ns/..",
        "ns/s*",
        "ns\\session",
        "ns/séance",
    ],
)
async def test_a_bad_scope_string_is_refused(object_store: S3ObjectStore, scope: str) -> None:
    with pytest.raises(ObjectRefError, match="invalid object scope"):
        await object_store.put(scope, BOUND, b"data")


async def test_a_ref_with_a_bad_scope_is_refused_on_get(object_store: S3ObjectStore, s3_server) -> None:
    digest = hashlib.sha256(b"x").hexdigest()
    scope = "a/b/c"
    ref = ObjectRef(
        uri=f"s3://{s3_server.bucket}/{scope}/{KEY_PART}/sha256/{digest}",
        sha256=digest,
        size=1,
        scope=scope,
        bound_to=BOUND,
    )
    with pytest.raises(ObjectRefError, match="invalid object scope"):
        await object_store.get(ref, expected_scope=scope, expected_binding=BOUND)


async def test_opening_the_store_creates_a_missing_bucket_idempotently(s3_server) -> None:
    bucket = f"tendon-new-{uuid.uuid4().hex[:12]}"
    for _ in range(2):
        async with S3ObjectStore(bucket=bucket, endpoint_url=s3_server.endpoint_url) as store:
            ref = await store.put("ns/session", BOUND, b"in a fresh bucket")
            assert ref.uri.startswith(f"s3://{bucket}/")
            fetched = await store.get(ref, expected_scope="ns/session", expected_binding=BOUND)
            assert fetched == b"in a fresh bucket"


async def test_an_unreachable_endpoint_is_a_transient_error(s3_server) -> None:
    # Port 9 on loopback (discard): nothing listens there, so the connection is refused.
    store = S3ObjectStore(bucket="tendon-test", endpoint_url="http://127.0.0.1:9")
    with pytest.raises(TransientError):
        async with store:
            pass


async def test_the_store_refuses_use_outside_its_context(s3_server) -> None:
    store = S3ObjectStore(bucket=s3_server.bucket, endpoint_url=s3_server.endpoint_url)
    with pytest.raises(RuntimeError, match="outside 'async with'"):
        await store.put("ns/session", BOUND, b"data")
