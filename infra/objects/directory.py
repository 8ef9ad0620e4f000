"""The embedded mode's object store: big envelope bodies as files in one directory.

Same contract as ``infra.objects.s3.S3ObjectStore`` (DESIGN invariant 9): immutable,
scope- and binding-checked, content-addressed objects under
``<root>/<namespace>/<session_id>/<execution_id>/<kind>[-<seq>]/sha256/<hex>`` (the key of
``infra.objects.payloads.object_key``), referenced as ``file://<absolute path>``; ``get`` verifies scope,
binding, path, size and sha256 before it hands out a single byte, with the same error messages.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from pathlib import Path

from infra.objects.keys import expected_key, object_key, verify_content
from protocol import ObjectRef, ObjectRefError

__all__ = ["DirectoryObjectStore"]


class DirectoryObjectStore:
    """Content-addressed, scope- and binding-checked payload storage under ``root``.

    Use as ``async with DirectoryObjectStore(root) as store``; file I/O runs in a worker thread.
    """

    def __init__(self, root: Path) -> None:
        # Resolved once, so every uri names one absolute path however ``root`` was spelled.
        self._root = Path(root).resolve()

    async def __aenter__(self) -> DirectoryObjectStore:
        """Create the root directory if it is missing (idempotent)."""
        await asyncio.to_thread(self._root.mkdir, parents=True, exist_ok=True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Nothing to release: every call opens and closes its own files."""

    async def put(self, scope: str, bound_to: str, data: bytes) -> ObjectRef:
        """Store ``data`` for the message ``bound_to`` under ``scope`` and return its ref;
        equal bytes for the same message are stored once."""
        digest = hashlib.sha256(data).hexdigest()
        path = self._root / object_key(scope, bound_to, digest)
        await asyncio.to_thread(self._put_sync, path, digest, data)
        return ObjectRef(uri=path.as_uri(), sha256=digest, size=len(data), scope=scope, bound_to=bound_to)

    async def get(self, ref: ObjectRef, *, expected_scope: str, expected_binding: str) -> bytes:
        """Fetch the bytes behind ``ref``, verified; raise ObjectRefError if anything is off."""
        key = expected_key(ref, expected_scope=expected_scope, expected_binding=expected_binding)
        path = self._root / key
        # The path must be derived from scope, binding and digest, never trusted as sent:
        # otherwise a ref could point at another session's or execution's object (or any file)
        # while claiming this one's scope and binding.
        if ref.uri != path.as_uri():
            raise ObjectRefError(f"object ref uri {ref.uri!r} does not match {path.as_uri()}")
        data = await asyncio.to_thread(self._get_sync, path, ref)
        return verify_content(ref, data)

    # ---- blocking parts, run in a worker thread -----------------------------------------

    @staticmethod
    def _put_sync(path: Path, digest: str, data: bytes) -> None:
        # Same name means same content, so an intact object is left alone (immutable).
        # Anything else there can only be corruption; writing the true bytes repairs it.
        try:
            if hashlib.sha256(path.read_bytes()).hexdigest() == digest:
                return
        except FileNotFoundError:
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write aside, fsync, then rename: a reader sees the whole object or none of it.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        # The rename itself is durable only once the directory entry is on disk.
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    @staticmethod
    def _get_sync(path: Path, ref: ObjectRef) -> bytes:
        try:
            with path.open("rb") as f:
                # Check the length first so a swapped, huge object is never pulled into memory.
                size = os.fstat(f.fileno()).st_size
                if size != ref.size:
                    raise ObjectRefError(
                        f"sha256 mismatch for {ref.uri}: object is {size} bytes, ref says {ref.size}"
                    )
                return f.read()
        except FileNotFoundError as exc:
            raise ObjectRefError(f"object {ref.uri} is missing") from exc
