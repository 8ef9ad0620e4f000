"""Where sandboxes physically are: one interface (:class:`SandboxBackend`), a local POSIX
backend (a directory and processes on the Hands' host, with NO isolation) and a Docker one (a
container per binding, its workspace a named volume). A cloud provider implements the same
eight methods."""

from __future__ import annotations

from hands.sandbox.backends.base import AlreadyExistsError, SandboxBackend, backend_for

__all__ = ["AlreadyExistsError", "SandboxBackend", "backend_for"]
