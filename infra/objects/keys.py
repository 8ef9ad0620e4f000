"""How an object is keyed, and what it is bound to.

An object's *binding* (``ObjectRef.bound_to``; not to be confused with a tool binding) names
the message the object is the body of, derived from the envelope header by
:func:`object_binding`:

    <execution_id>/<kind>/<seq>    an execution event (accepted, started, output_page,
                                   succeeded, failed, cancelled, unknown)
    <execution_id>/<kind>          a command or control (execute, cancel, replay)

Every store keeps an object under the key :func:`object_key` derives from scope, binding and
digest, never under anything a ref says::

    <namespace>/<session_id>/<execution_id>/<kind>[-<seq>]/sha256/<hex>

so a ref written for one execution (or one event) can't stand in for another's body, even
inside the same session: the receiver expects the binding of the header it is resolving.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from protocol import ObjectRef, ObjectRefError

_SCOPE = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
# The kind has no '-' so that "<kind>-<seq>" in a key reads back one way only.
_BINDING = re.compile(r"(?P<execution>[A-Za-z0-9_.-]+)/(?P<kind>[a-z_]+)(?:/(?P<seq>[1-9][0-9]*))?")


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


def check_binding(bound_to: str) -> str:
    """Return ``bound_to`` if it is ``execution_id/kind[/seq]``; raise ObjectRefError otherwise.

    Execution ids come from messages, so the same care as for scopes: no '/', '.' or '..'
    inside a segment, nothing outside [A-Za-z0-9_.-].
    """
    match = _BINDING.fullmatch(bound_to) if isinstance(bound_to, str) else None
    if match is None or match["execution"] in (".", ".."):
        raise ObjectRefError(
            f"invalid object binding {bound_to!r}: expected 'execution_id/kind' or "
            "'execution_id/kind/seq' (execution id [A-Za-z0-9_.-]+, kind [a-z_]+, seq 1, 2, ...)"
        )
    return bound_to


def object_binding(envelope: Any) -> str:
    """What an object stored as ``envelope``'s body is bound to: its execution, kind and seq."""
    seq = getattr(envelope, "seq", None)
    parts = [envelope.execution_id, envelope.kind] + ([] if seq is None else [str(seq)])
    return check_binding("/".join(parts))


def object_key(scope: str, bound_to: str, sha256: str) -> str:
    """The one storage key of an object: ``<scope>/<execution_id>/<kind>[-<seq>]/sha256/<hex>``."""
    check_scope(scope)
    execution, kind, *seq = check_binding(bound_to).split("/")
    return f"{scope}/{execution}/{'-'.join([kind, *seq])}/sha256/{sha256}"


def expected_key(ref: ObjectRef, *, expected_scope: str, expected_binding: str) -> str:
    """The key ``ref`` must point at, once its scope and binding are the expected ones.

    Raises ObjectRefError naming both values when the ref was written for another session,
    another execution or another message; nothing is fetched before this passed.
    """
    if ref.scope != expected_scope:
        raise ObjectRefError(f"object ref scope {ref.scope!r} does not match expected {expected_scope!r}")
    if ref.bound_to != expected_binding:
        raise ObjectRefError(
            f"object ref bound_to {ref.bound_to!r} does not match expected {expected_binding!r}"
        )
    return object_key(ref.scope, ref.bound_to, ref.sha256)


def verify_content(ref: ObjectRef, data: bytes) -> bytes:
    """Return ``data`` if its size and sha256 are the ones ``ref`` promises; else refuse it."""
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != ref.size or digest != ref.sha256:
        raise ObjectRefError(
            f"sha256 mismatch for {ref.uri}: got {digest} ({len(data)} bytes), "
            f"ref says {ref.sha256} ({ref.size} bytes)"
        )
    return data
