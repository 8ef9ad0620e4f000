"""The interface every sandbox backend implements, and choosing one from ``--sandbox``.

A backend knows sandboxes only by their *identity* (a name the binding's row committed before
asking) and answers for what it holds under it; it keeps no state of its own, so any worker of
the pool can pick a sandbox up. Paths are relative to the workspace root.
"""

from __future__ import annotations

from typing import Any, Protocol

from protocol import SchemaError, TendonError


class AlreadyExistsError(TendonError):
    """Something already holds the identity: a creation never makes a second one."""

    code = "sandbox_exists"


class ProviderError(TendonError):
    """The provider refused or failed a call (the message says which and why)."""

    code = "sandbox_provider_error"
    retryable = True


class SandboxBackend(Protocol):
    kind: str

    def config(self) -> dict[str, Any]:
        """What a binding freezes of this backend (no secret values)."""
        ...

    async def find(self, identity: str) -> dict[str, str] | None:
        """The labels of what the provider holds under ``identity`` ({} for an object without
        labels); None when it holds nothing there."""
        ...

    async def create(self, identity: str, labels: dict[str, str]) -> None:
        """Make the sandbox under ``identity`` with ``labels``; AlreadyExistsError if taken."""
        ...

    async def resume(self, identity: str) -> None:
        """Make the sandbox under ``identity`` able to run commands (start it if stopped)."""
        ...

    async def delete(self, identity: str) -> None:
        """Remove the sandbox and its workspace; nothing there is no error (idempotent)."""
        ...

    async def shell(self, identity: str, script: str) -> tuple[int, bytes]:
        """Run ``sh -c script`` in the workspace and wait: (exit code, standard output)."""
        ...

    async def write_file(self, identity: str, path: str, data: bytes) -> None: ...

    async def read_file(self, identity: str, path: str, offset: int = 0, limit: int = -1) -> bytes | None:
        """Bytes of a workspace file from ``offset`` (at most ``limit``; -1: all); None if absent."""
        ...


def backend_for(spec: str, *, image: str, network: str) -> SandboxBackend:
    """``local:DIRECTORY`` or ``docker`` (``--sandbox`` / ``TENDON_SANDBOX``)."""
    kind, _, where = spec.partition(":")
    if kind == "local" and where:
        from hands.sandbox.backends.local import LocalBackend

        return LocalBackend(where)
    if kind == "docker" and not where:
        from hands.sandbox.backends.docker import DockerBackend

        return DockerBackend(image=image, network=network)
    raise SchemaError(f"sandbox backend {spec!r}: give 'local:DIRECTORY' or 'docker'")
