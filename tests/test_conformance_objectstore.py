"""One object-store contract, run against S3 (moto's server) and a directory on disk.

Invariant 9 on both backends of issue 3: payloads are stored once per scope and content, and
``get`` refuses anything it can't verify (scope, location, size, sha256) before handing out
a single byte. No mocks: the S3 side talks HTTP to a real S3 API server.
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

from infra.dirstore import DirectoryObjectStore
from infra.payloads import (
    ObjectStore,
    check_scope,  # the one scope rule
)
from protocol import ObjectRef, ObjectRefError


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


async def test_a_payload_round_trips_under_a_content_addressed_ref(backend: Backend) -> None:
    scope, data = _scope(), b'{"hello": "world"}' * 100
    ref = await backend.store.put(scope, data)
    digest = hashlib.sha256(data).hexdigest()
    assert (ref.sha256, ref.size, ref.scope) == (digest, len(data), scope)
    assert ref.uri.startswith(f"{backend.scheme}://")
    assert ref.uri.endswith(f"/{scope}/sha256/{digest}")
    assert await backend.store.get(ref, expected_scope=scope) == data


async def test_an_empty_payload_round_trips(backend: Backend) -> None:
    scope = _scope()
    ref = await backend.store.put(scope, b"")
    assert await backend.store.get(ref, expected_scope=scope) == b""


async def test_the_same_content_gets_the_same_ref_and_another_scope_another_ref(backend: Backend) -> None:
    scope, other = _scope(), _scope()
    first = await backend.store.put(scope, b"same bytes")
    assert await backend.store.put(scope, b"same bytes") == first
    elsewhere = await backend.store.put(other, b"same bytes")
    assert elsewhere.uri != first.uri and elsewhere.sha256 == first.sha256


async def test_a_ref_is_refused_for_any_other_scope(backend: Backend) -> None:
    scope = _scope()
    ref = await backend.store.put(scope, b"private")
    with pytest.raises(ObjectRefError, match="does not match expected"):
        await backend.store.get(ref, expected_scope=_scope())


async def test_a_tampered_object_of_the_same_size_is_refused(backend: Backend) -> None:
    scope = _scope()
    ref = await backend.store.put(scope, b"original")
    backend.overwrite(ref, b"ORIGINAL")
    with pytest.raises(ObjectRefError, match="sha256 mismatch"):
        await backend.store.get(ref, expected_scope=scope)


async def test_a_tampered_object_of_another_size_is_refused(backend: Backend) -> None:
    scope = _scope()
    ref = await backend.store.put(scope, b"original")
    backend.overwrite(ref, b"much longer than the original" * 1000)
    with pytest.raises(ObjectRefError, match="sha256 mismatch"):
        await backend.store.get(ref, expected_scope=scope)


async def test_putting_the_content_again_repairs_a_damaged_object(backend: Backend) -> None:
    scope = _scope()
    ref = await backend.store.put(scope, b"original")
    backend.overwrite(ref, b"truncated")
    assert await backend.store.put(scope, b"original") == ref
    assert await backend.store.get(ref, expected_scope=scope) == b"original"


async def test_a_missing_object_is_refused(backend: Backend) -> None:
    scope = _scope()
    ref = await backend.store.put(scope, b"soon gone")
    backend.delete(ref)
    with pytest.raises(ObjectRefError, match="is missing"):
        await backend.store.get(ref, expected_scope=scope)


async def test_a_ref_whose_uri_points_at_another_scope_is_refused(backend: Backend) -> None:
    # The attacker's session stored the bytes; the forged ref claims the victim's scope.
    theirs, victim = _scope(), _scope()
    stored = await backend.store.put(theirs, b"not yours")
    forged = stored.model_copy(update={"scope": victim})
    with pytest.raises(ObjectRefError, match="uri .* does not match"):
        await backend.store.get(forged, expected_scope=victim)


@pytest.mark.parametrize(
    "uri", ["{scheme}:///etc/passwd", "{scheme}://elsewhere/{key}", "{uri}/../{sha}", "{uri}?x=1"]
)
async def test_a_ref_whose_uri_is_not_exactly_the_stores_own_is_refused(backend: Backend, uri: str) -> None:
    scope = _scope()
    ref = await backend.store.put(scope, b"payload")
    key = f"{scope}/sha256/{ref.sha256}"
    forged = ref.model_copy(
        update={"uri": uri.format(scheme=backend.scheme, key=key, uri=ref.uri, sha=ref.sha256)}
    )
    with pytest.raises(ObjectRefError, match="uri .* does not match"):
        await backend.store.get(forged, expected_scope=scope)


@pytest.mark.parametrize("scope", ["", "one", "a/b/c", "../x", "a/..", "./b", "a b/c", "a/b\n"])
async def test_an_invalid_scope_is_refused_with_the_same_words_everywhere(
    backend: Backend, scope: str
) -> None:
    with pytest.raises(ObjectRefError) as reference:
        check_scope(scope)
    with pytest.raises(ObjectRefError) as put:
        await backend.store.put(scope, b"x")
    assert str(put.value) == str(reference.value)
    ref = ObjectRef(uri=f"{backend.scheme}://x", sha256="0" * 64, size=1, scope=scope or "?")
    with pytest.raises(ObjectRefError) as get:
        await backend.store.get(ref, expected_scope=scope or "?")
    assert str(get.value).startswith("invalid object scope")
