"""The one error tree of Tendon.

TendonError                      root; ``retryable`` says whether trying again can help
├── ProtocolError                a message or input that can never be accepted as it is
│   ├── DecodeError              not strict JSON (duplicate keys, trailing values, lossy numbers)
│   ├── SchemaError              valid JSON, wrong shape for its kind
│   └── TooLargeError            a request body over the size a server takes (TENDON_MAX_REQUEST_BYTES)
├── ConflictError                same request id, different input; same execution id, different digest
├── NotFoundError                an id that does not exist (or that belongs to another namespace)
├── GoneError                    a cursor older than what retention keeps: start again from a snapshot
├── AuthError                    no valid credentials for the HTTP API
├── ForbiddenError               valid credentials, but not for this
├── IllegalTransitionError       a state machine was asked to make a move its table forbids
├── StaleOwnerError              a commit from an owner whose lease epoch is no longer current (fencing)
├── RoutingError                 an unknown route, tool or binding digest
│   └── UnknownToolError         a submit names a tool no Hands pool has ever announced
├── LimitReachedError            an agent hit one of its configured limits
├── ObjectRefError               a payload reference that fails verification (sha256, size, scope, missing)
├── NoAnswerError                a party that must answer (a Hands pool) stayed silent through every retry
├── ParkedError                  a message about the work could never be processed and was parked
├── ModelError                   the model's API failed or answered nonsense; retryable or not, by
│                                what happened (a timeout, a 429 or a 5xx are; a 400 is not)
├── ReplayDivergedError          a framework's agent asked the model something else on replay than
│                                when the committed reply was made (its code is not deterministic)
└── TransientError               a service is briefly unavailable; retryable
"""

from __future__ import annotations


class TendonError(Exception):
    """Root of every error Tendon raises on purpose."""

    retryable: bool = False
    code: str = "tendon_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def as_dict(self) -> dict[str, str]:
        """The error as it travels in envelopes and rows: a stable code and a readable message."""
        return {"code": self.code, "message": self.message}


class ProtocolError(TendonError):
    code = "protocol_error"


class DecodeError(ProtocolError):
    code = "decode_error"


class SchemaError(ProtocolError):
    code = "schema_error"


class TooLargeError(ProtocolError):
    code = "too_large"


class ConflictError(TendonError):
    code = "conflict"


class NotFoundError(TendonError):
    code = "not_found"


class GoneError(TendonError):
    code = "gone"


class AuthError(TendonError):
    code = "unauthorized"


class ForbiddenError(TendonError):
    code = "forbidden"


class IllegalTransitionError(TendonError):
    code = "illegal_transition"


class StaleOwnerError(TendonError):
    code = "stale_owner"


class RoutingError(TendonError):
    code = "routing_error"


class UnknownToolError(RoutingError):
    """A submit whose agent names tools no Hands pool has ever announced (a misspelt name, or a
    pool not started yet): refused before anything is written, unless the submit or the agent
    says they are expected later. ``unknown``: those tools; ``known``: the tools that can be named."""

    code = "unknown_tool"

    def __init__(
        self, message: str, *, unknown: list[str] | None = None, known: list[str] | None = None
    ) -> None:
        super().__init__(message)
        self.unknown = unknown or []
        self.known = known or []


class LimitReachedError(TendonError):
    code = "limit_reached"


class ObjectRefError(TendonError):
    code = "object_ref_error"


class NoAnswerError(TendonError):
    code = "no_answer"


class ParkedError(TendonError):
    code = "parked"


class ModelError(TendonError):
    """A model call that failed: ``retryable`` and ``retry_after`` (seconds the API asked to wait,
    a 429's Retry-After) travel with it, as the classification decided."""

    code = "model_error"

    def __init__(self, message: str, *, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


class ReplayDivergedError(TendonError):
    code = "replay_diverged"


class TransientError(TendonError):
    code = "transient"
    retryable = True


def is_retryable(exc: BaseException) -> bool:
    """Classify any exception: only errors that say so (or known transient I/O faults) are retried."""
    if isinstance(exc, TendonError):
        return exc.retryable
    return isinstance(exc, (ConnectionError, TimeoutError, OSError))


def error_of(code: str, message: str) -> TendonError:
    """The error a wire answer names by its ``code``: the class of the tree that has that code
    (the first met from the root: a base before its subclasses), else a ``TendonError``."""
    found: dict[str, type[TendonError]] = {}
    kinds: list[type[TendonError]] = [TendonError]
    while kinds:
        kind = kinds.pop(0)
        found.setdefault(kind.code, kind)
        kinds += kind.__subclasses__()
    error = found.get(code, TendonError)(message)
    error.code = code
    return error
