"""The errors a sandbox tool or command reaches its user with, each under protocol's tree."""

from __future__ import annotations

from protocol import ConflictError, ForbiddenError


class SandboxGoneError(ConflictError):
    """The binding's physical sandbox, or its workspace marker, is missing or not this binding's:
    it is never re-created behind the agent's back."""

    code = "sandbox_gone"


class SandboxDeletingError(ConflictError):
    """The binding is being deleted (or was): it takes no new command."""

    code = "sandbox_deleting"


class SandboxUnknownError(ConflictError):
    """The binding's creation could not be confirmed: it waits for ``reconcile-creation``."""

    code = "sandbox_unknown"


class SandboxForbiddenError(ForbiddenError):
    """Another session's private sandbox."""

    code = "sandbox_forbidden"
