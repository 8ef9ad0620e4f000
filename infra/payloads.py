"""Envelope bodies over the offload threshold travel through object storage by reference.

``pack`` swaps a big inline body for an ``ObjectRef`` (content-addressed, scoped to the
envelope's namespace/session); ``unpack`` strictly decodes and, for a reference, fetches
and verifies sha256, size and scope before anything trusts the body.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from infra.settings import Settings
from protocol import ObjectRef, ObjectRefError, body_bytes, decode, encode, loads, with_body

_SCOPE = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")


def check_scope(scope: str) -> str:
    """Return ``scope`` if it is ``namespace/session_id``; raise ObjectRefError otherwise.

    The one rule every object store applies; "." and ".." are refused too, since paths and
    some proxies would normalise them out of a key.
    """
    if (
        not isinstance(scope, str)
        or not _SCOPE.fullmatch(scope)
        or any(part in (".", "..") for part in scope.split("/"))
    ):
        raise ObjectRefError(
            f"invalid object scope {scope!r}: expected 'namespace/session_id', "
            "two segments of [A-Za-z0-9_.-]+"
        )
    return scope


def verify_content(ref: ObjectRef, data: bytes) -> bytes:
    """Return ``data`` if its size and sha256 are the ones ``ref`` promises; else refuse it."""
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != ref.size or digest != ref.sha256:
        raise ObjectRefError(
            f"sha256 mismatch for {ref.uri}: got {digest} ({len(data)} bytes), "
            f"ref says {ref.sha256} ({ref.size} bytes)"
        )
    return data


class ObjectStore(Protocol):
    async def put(self, scope: str, data: bytes) -> ObjectRef: ...

    async def get(self, ref: ObjectRef, *, expected_scope: str) -> bytes: ...


class PayloadCodec:
    """Encode/decode envelopes, offloading bodies larger than ``threshold`` bytes."""

    def __init__(self, store: ObjectStore | None, threshold: int) -> None:
        self.store = store
        self.threshold = threshold

    async def pack(self, envelope: Any) -> bytes:
        raw = encode(envelope)
        if len(raw) <= self.threshold or envelope.body is None or not hasattr(envelope, "scope"):
            return raw
        if self.store is None:
            raise ObjectRefError(
                f"{envelope.kind} envelope is {len(raw)} bytes, over the offload threshold "
                f"({self.threshold}), and no object store is configured (set TENDON_S3_*)"
            )
        ref = await self.store.put(envelope.scope, body_bytes(envelope))
        return encode(envelope.model_copy(update={"body": None, "body_ref": ref}))

    async def unpack(self, raw: bytes) -> Any:
        """Decode one envelope and resolve its body reference, verified. Raises TendonError."""
        return await self.resolve(decode(raw))

    async def resolve(self, envelope: Any) -> Any:
        """Replace a decoded envelope's ``body_ref`` by its fetched, verified body."""
        if envelope.body_ref is None:
            return envelope
        if self.store is None:
            raise ObjectRefError("envelope carries a body_ref but no object store is configured")
        if not hasattr(envelope, "scope"):
            raise ObjectRefError(f"{envelope.kind} envelopes may not carry a body_ref")
        data = await self.store.get(envelope.body_ref, expected_scope=envelope.scope)
        return with_body(envelope, loads(data))


@asynccontextmanager
async def open_payload_codec(settings: Settings) -> AsyncIterator[PayloadCodec]:
    """The codec a process uses: S3-backed when ``TENDON_S3_ENDPOINT_URL`` is set."""
    if not settings.s3_endpoint_url:
        yield PayloadCodec(None, settings.offload_threshold)
        return
    from infra.objectstore import S3ObjectStore  # boto3 is only loaded when S3 is in use

    async with S3ObjectStore(
        bucket=settings.s3_bucket, endpoint_url=settings.s3_endpoint_url, region=settings.s3_region
    ) as store:
        yield PayloadCodec(store, settings.offload_threshold)
