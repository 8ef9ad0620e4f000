"""Envelope bodies over the offload threshold travel through object storage by reference.

``pack`` swaps a big inline body for an ``ObjectRef`` (content-addressed, scoped to the
envelope's namespace/session and bound to the one message it was written for); ``unpack``
strictly decodes and, for a reference, fetches and verifies scope, binding, sha256 and size
before anything trusts the body.
How objects are keyed and bound to their message is ``keys``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from infra.process.settings import Settings
from infra.objects.keys import object_binding
from infra.process.startup import wait_for
from protocol import (
    Encoded,
    ExecuteCommand,
    ObjectRef,
    ObjectRefError,
    body_bytes,
    decode,
    dumps,
    event_data,
    event_model,
    execute_data,
    loads,
    with_body,
)


class ObjectStore(Protocol):
    async def put(self, scope: str, bound_to: str, data: bytes) -> ObjectRef: ...

    async def get(self, ref: ObjectRef, *, expected_scope: str, expected_binding: str) -> bytes: ...


class PayloadCodec:
    """Encode/decode envelopes, offloading bodies larger than ``threshold`` bytes."""

    def __init__(self, store: ObjectStore | None, threshold: int) -> None:
        self.store = store
        self.threshold = threshold

    async def pack(self, envelope: Any) -> bytes:
        """The envelope's wire form, its body offloaded when the whole is over the threshold."""
        return dumps(await self.pack_data(envelope))

    async def pack_data(self, envelope: Any) -> Encoded:
        """What :meth:`pack` sends, as JSON data that carries its bytes (for a ledger that keeps
        events to send again: stored and sent without being encoded again)."""
        data = Encoded(envelope.model_dump(mode="json"))
        size = len(data.raw)
        if size <= self.threshold or envelope.body is None or not hasattr(envelope, "scope"):
            return data
        if self.store is None:
            raise ObjectRefError(
                f"{envelope.kind} envelope is {size} bytes, over the offload threshold "
                f"({self.threshold}), and no object store is configured (set TENDON_S3_*)"
            )
        ref = await self.store.put(envelope.scope, object_binding(envelope), body_bytes(envelope))
        return Encoded(envelope.model_copy(update={"body": None, "body_ref": ref}).model_dump(mode="json"))

    async def pack_event(self, execution_id: str, header: Mapping[str, str], seq: int, body: Any) -> Encoded:
        """:meth:`pack_data` of the event that carries ``body`` as event ``seq``, made as JSON
        (``protocol.event_data``)."""
        data = Encoded(event_data(execution_id, header, seq, body))
        return await self._made(data, lambda: event_model(execution_id, header, seq, body))

    async def pack_execute(
        self, execution_id: str, namespace: str, session_id: str, body: Any, trace: str | None = None
    ) -> Encoded:
        """:meth:`pack_data` of the ``ExecuteCommand`` of ``body``, made as JSON
        (``protocol.execute_data``)."""
        data = Encoded(execute_data(execution_id, namespace, session_id, body, trace))
        return await self._made(data, lambda: ExecuteCommand.model_validate(data))

    async def _made(self, data: Encoded, model: Callable[[], Any]) -> Encoded:
        """``data`` as it is, or, over the threshold, its model packed (its body goes to the store):
        the model is made only then."""
        if len(data.raw) <= self.threshold:
            return data
        return await self.pack_data(model())

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
        data = await self.store.get(
            envelope.body_ref, expected_scope=envelope.scope, expected_binding=object_binding(envelope)
        )
        return with_body(envelope, loads(data))


@asynccontextmanager
async def open_payload_codec(settings: Settings, *, patience: float = 0.0) -> AsyncIterator[PayloadCodec]:
    """The codec a process uses: S3-backed when ``TENDON_S3_ENDPOINT_URL`` is set (waiting up to
    ``patience`` seconds for the object store to answer)."""
    if not settings.s3_endpoint_url:
        yield PayloadCodec(None, settings.offload_threshold)
        return
    from infra.objects.s3 import S3ObjectStore  # boto3 is only loaded when S3 is in use

    store = S3ObjectStore(
        bucket=settings.s3_bucket, endpoint_url=settings.s3_endpoint_url, region=settings.s3_region
    )
    await wait_for(
        store.__aenter__, service="the object store", url=settings.s3_endpoint_url, patience=patience
    )
    try:
        yield PayloadCodec(store, settings.offload_threshold)
    finally:
        await store.__aexit__(None, None, None)
