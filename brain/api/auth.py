"""Who calls the HTTP API: a bearer token stands for one namespace, or for an operator.

Tokens are configured hashed (``TENDON_API_TOKENS=NAMESPACE:SHA256,...``, and
``TENDON_OPERATOR_TOKENS=SHA256,...``): the server never holds one in clear. `brain token
NAMESPACE` makes a new one and prints the line to configure. With no token configured at all the
API is a development server: every request acts in ``TENDON_NAMESPACE`` and may use the operator
routes (it listens on loopback by default).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from protocol import AuthError, ForbiddenError, SchemaError

# What a namespace may be named: what an object's scope allows (``infra.objects.keys``), and no
# ``/``, which separates it from the session id in the store's key of a session.
_NAMESPACE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def check_namespace(namespace: str) -> str:
    """``namespace`` if it is a valid name, else SchemaError."""
    if not _NAMESPACE.fullmatch(namespace):
        raise SchemaError(f"namespace {namespace!r} is not valid: 1 to 64 letters, digits, '_', '.' or '-'")
    return namespace


@dataclass(frozen=True)
class Caller:
    """Whom a request acts for: its namespace (None for an operator token), and whether it may
    use the operator routes."""

    namespace: str | None
    operator: bool

    def tenant(self) -> str:
        """The namespace a tenant route acts in; an operator token reaches only operator routes."""
        if self.namespace is None:
            raise ForbiddenError("an operator token reaches only the operator routes (/v1/operator/...)")
        return self.namespace

    def operate(self) -> None:
        if not self.operator:
            raise ForbiddenError("this route needs an operator token")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    return secrets.token_urlsafe(32)


class Tokens:
    """The configured tokens, by hash."""

    def __init__(self, api_tokens: str, operator_tokens: str, default_namespace: str) -> None:
        self.default_namespace = default_namespace
        self.namespaces: dict[str, str] = {}  # hash -> namespace
        for item in filter(None, (p.strip() for p in api_tokens.split(","))):
            namespace, _, digest = item.rpartition(":")
            if not namespace or len(digest) != 64:
                raise SchemaError(
                    "TENDON_API_TOKENS takes NAMESPACE:SHA256 pairs separated by commas "
                    "(`brain token NAMESPACE` prints one)"
                )
            self.namespaces[digest.lower()] = check_namespace(namespace)
        self.operators = [d.strip().lower() for d in operator_tokens.split(",") if d.strip()]
        if any(len(d) != 64 for d in self.operators):
            raise SchemaError("TENDON_OPERATOR_TOKENS takes SHA256 hashes separated by commas")

    @property
    def open(self) -> bool:
        """No token configured: a development server."""
        return not self.namespaces and not self.operators

    def caller(self, authorization: str | None) -> Caller:
        """The caller a request's ``Authorization`` header stands for; AuthError if none."""
        if self.open:
            return Caller(self.default_namespace, operator=True)
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthError("this API needs `Authorization: Bearer TOKEN`")
        digest = hash_token(token.strip())
        for known, namespace in self.namespaces.items():
            if hmac.compare_digest(known, digest):
                return Caller(namespace, operator=False)
        for known in self.operators:
            if hmac.compare_digest(known, digest):
                return Caller(None, operator=True)
        raise AuthError("the token is not known here")
