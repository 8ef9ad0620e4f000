"""Bindings, identities and markers: what names a sandbox and how it is recognised.

A *binding* is (namespace, binding id, definition and its version, frozen configuration
reference). A call names a binding with its ``sandbox`` argument, or none: then the binding is the
session's own, ``session:<session id>``, private to it. A named binding is shared by the sessions
of its namespace (that is what naming one is for); nobody outside the namespace ever sees it,
since every key starts with the namespace the execution came in.

The *identity* is the provider's name for the sandbox (a container and its volume, a directory):
derived from the namespace, binding id and generation, so it is known, and committed, before the
provider is asked. The *nonce* is drawn at the same commit; the provider's labels and the marker
file written into the workspace carry it, so a sandbox found under the identity is this binding's
only if its nonce is.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from hands.sandbox.rules.errors import SandboxForbiddenError
from protocol import SchemaError

PRIVATE = "session:"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
MARKER = ".tendon/marker.json"
LABEL = "io.tendon.sandbox"  # the label (and marker field) prefix


def binding_id(session_id: str, sandbox: str | None) -> str:
    """The binding a call uses: the one it names, or its session's own."""
    if sandbox is None:
        return PRIVATE + session_id
    if not _NAME.fullmatch(sandbox):
        raise SchemaError(
            f"sandbox name {sandbox!r}: 1 to 100 letters, digits, '_', '.' or '-', starting with a "
            "letter or digit"
        )
    return sandbox


def may_use(binding: str, owner_session: str, session_id: str) -> None:
    """A session's own sandbox is its own; a named one is its namespace's."""
    if binding.startswith(PRIVATE) and owner_session != session_id:
        raise SandboxForbiddenError(f"sandbox {binding} belongs to another session")


def identity(namespace: str, binding: str, generation: int) -> str:
    """The provider's name for a binding's sandbox: a container, volume or directory name."""
    h = hashlib.sha256(f"{namespace}\x00{binding}".encode()).hexdigest()[:20]
    return f"tendon-sbx-{h}-{generation}"


def labels(namespace: str, binding: str, nonce: str, ident: str) -> dict[str, str]:
    """What the provider's object carries (Docker labels) and the marker file says."""
    return {
        f"{LABEL}.identity": ident,
        f"{LABEL}.namespace": namespace,
        f"{LABEL}.binding": binding,
        f"{LABEL}.nonce": nonce,
    }


class Found(StrEnum):
    """What a look at the provider under a binding's identity found."""

    OURS = "ours"  # labels carry this binding's nonce: its creation went through
    NOTHING = "nothing"  # nothing under the identity: creating it is its first creation
    FOREIGN = "foreign"  # something without this binding's labels: not ours to adopt


def judge(found: dict[str, str] | None, expected: dict[str, str]) -> Found:
    """Which of :class:`Found` the provider's answer (its labels; None: nothing there) is."""
    if found is None:
        return Found.NOTHING
    mine = {k: v for k, v in found.items() if k.startswith(LABEL)}
    return Found.OURS if mine == expected else Found.FOREIGN


@dataclass(frozen=True)
class Definition:
    """What a pool makes sandboxes from. ``config`` is frozen into each binding as its reference:
    the backend, image, network and the *names* of the host variables a command gets, never a
    value."""

    name: str
    config: dict[str, Any]

    @property
    def version(self) -> str:
        canonical = repr(sorted(self.config.items())).encode()
        return hashlib.sha256(canonical).hexdigest()[:12]


def marker_problem(marker: Any, expected: dict[str, str]) -> str | None:
    """Why the workspace marker read back is not the one this binding's creation wrote (None: it
    is)."""
    if marker is None:
        return f"its workspace marker ({MARKER}) is missing"
    if not isinstance(marker, dict) or marker != expected:
        return f"its workspace marker ({MARKER}) names another sandbox: {marker!r:.200}"
    return None
