"""S3 object store for big envelope bodies (DESIGN invariant 9).

Payloads above the envelope threshold are stored under an immutable, scoped, bound,
content-addressed key ``<namespace>/<session_id>/<execution_id>/<kind>[-<seq>]/sha256/<hex>``
(``infra.objects.payloads.object_key``): one object per session, message it was written for, and
content. The receiver verifies scope, binding, key, size and sha256 before it hands out a
single byte, so it never acks what it can't verify.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from s3transfer.exceptions import RetriesExceededError

from infra.objects.keys import expected_key, object_key, verify_content
from protocol import ObjectRef, ObjectRefError, TransientError

_MISSING = {"404", "NoSuchKey", "NotFound", "NoSuchBucket"}
_TRANSIENT = {"SlowDown", "RequestTimeout", "ServiceUnavailable", "InternalError", "Throttling"}
# Managed transfer switches to multipart above 8 MiB, so 100 MiB bodies go up in parallel parts.
_TRANSFER = TransferConfig(multipart_threshold=8 * 1024 * 1024, multipart_chunksize=8 * 1024 * 1024)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _is_transient(exc: Exception) -> bool:
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return _code(exc) in _TRANSIENT or int(status or 0) >= 500
    # Connection refused, timeouts, closed connections; downloads that kept failing mid-body.
    return isinstance(exc, (BotoCoreError, RetriesExceededError))


class S3ObjectStore:
    """Content-addressed, scope- and binding-checked payload storage in one S3 bucket.

    Use as ``async with S3ObjectStore(bucket=...) as store``. Credentials come from the usual
    AWS environment variables; ``endpoint_url`` points at MinIO or moto instead of AWS.
    """

    def __init__(self, *, bucket: str, endpoint_url: str | None = None, region: str = "us-east-1") -> None:
        self._bucket = bucket
        self._endpoint_url = endpoint_url
        self._region = region
        self._client: Any = None

    async def __aenter__(self) -> S3ObjectStore:
        """Create the client and the bucket if it is missing (idempotent)."""
        # Building a client parses botocore's JSON models: keep that off the event loop too.
        self._client = await self._call(self._open)
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close the client's connection pool."""
        client, self._client = self._client, None
        if client is not None:
            await asyncio.to_thread(client.close)

    async def put(self, scope: str, bound_to: str, data: bytes) -> ObjectRef:
        """Store ``data`` for the message ``bound_to`` under ``scope`` and return its ref;
        equal bytes for the same message are stored once."""
        digest = hashlib.sha256(data).hexdigest()
        key = object_key(scope, bound_to, digest)
        await self._call(self._put_sync, key, data)
        uri = f"s3://{self._bucket}/{key}"
        return ObjectRef(uri=uri, sha256=digest, size=len(data), scope=scope, bound_to=bound_to)

    async def get(self, ref: ObjectRef, *, expected_scope: str, expected_binding: str) -> bytes:
        """Fetch the bytes behind ``ref``, verified; raise ObjectRefError if anything is off."""
        key = expected_key(ref, expected_scope=expected_scope, expected_binding=expected_binding)
        # The key must be derived from scope, binding and digest, never trusted as sent:
        # otherwise a ref could point at another session's (or execution's) object while
        # claiming this one's scope and binding.
        if ref.uri != f"s3://{self._bucket}/{key}":
            raise ObjectRefError(f"object ref uri {ref.uri!r} does not match s3://{self._bucket}/{key}")
        data = await self._call(self._get_sync, key, ref)
        return verify_content(ref, data)

    # ---- blocking parts, run in a worker thread -----------------------------------------

    async def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args)
        except (ClientError, BotoCoreError, RetriesExceededError) as exc:
            if _is_transient(exc):
                raise TransientError(f"object store unavailable: {exc}") from exc
            raise

    def _s3(self) -> Any:
        if self._client is None:
            raise RuntimeError("S3ObjectStore used outside 'async with'")
        return self._client

    def _open(self) -> Any:
        # Path-style addressing: MinIO and moto on an IP endpoint have no per-bucket host names.
        style = "path" if self._endpoint_url else "auto"
        config = Config(retries={"mode": "standard"}, s3={"addressing_style": style})
        client = boto3.session.Session().client(
            "s3", endpoint_url=self._endpoint_url, region_name=self._region, config=config
        )
        try:
            client.head_bucket(Bucket=self._bucket)
        except ClientError as exc:
            if _code(exc) not in _MISSING:
                client.close()
                raise
            kwargs: dict[str, Any] = {"Bucket": self._bucket}
            if self._region != "us-east-1":  # us-east-1 refuses an explicit location constraint
                kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self._region}
            try:
                client.create_bucket(**kwargs)
            except ClientError as race:  # another process created it first: that's fine
                if _code(race) not in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
                    client.close()
                    raise
        return client

    def _put_sync(self, key: str, data: bytes) -> None:
        s3 = self._s3()
        try:
            head = s3.head_object(Bucket=self._bucket, Key=key)
            # Same key means same content, so an existing object is left alone (immutable).
            # A wrong length can only be corruption; rewriting the true bytes repairs it.
            if head.get("ContentLength") == len(data):
                return
        except ClientError as exc:
            if _code(exc) not in _MISSING:
                raise
        s3.upload_fileobj(io.BytesIO(data), self._bucket, key, Config=_TRANSFER)

    def _get_sync(self, key: str, ref: ObjectRef) -> bytes:
        s3 = self._s3()
        try:
            # Check the length first so a swapped, huge object is never pulled into memory.
            size = s3.head_object(Bucket=self._bucket, Key=key).get("ContentLength")
            if size != ref.size:
                raise ObjectRefError(
                    f"sha256 mismatch for {ref.uri}: object is {size} bytes, ref says {ref.size}"
                )
            buf = io.BytesIO()
            s3.download_fileobj(self._bucket, key, buf, Config=_TRANSFER)
        except ClientError as exc:
            if _code(exc) in _MISSING:
                raise ObjectRefError(f"object {ref.uri} is missing") from exc
            raise
        return buf.getvalue()
