"""Envelope bodies over the offload threshold travel through object storage by reference.

``pack`` swaps a big inline body for an ``ObjectRef`` (content-addressed, scoped to the
envelope's namespace/session); ``unpack`` strictly decodes and, for a reference, fetches
and verifies sha256, size and scope before anything trusts the body.
"""

from __future__ import annotations

from typing import Any, Protocol

from protocol import ObjectRef, ObjectRefError, body_bytes, decode, encode, loads, with_body


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
