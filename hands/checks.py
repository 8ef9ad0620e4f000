"""What makes a command unusable before anything is recorded of it: names the ledger cannot
store, a request digest that does not match the command, a route that is not this pool's. Each
such command is parked with the reason these return; it can never succeed, so redelivery would
not help."""

from __future__ import annotations

from infra.db import unstorable
from protocol import ExecuteCommand, request_digest


def unstorable_names(command: ExecuteCommand) -> str | None:
    """Why the ids and names a command carries cannot be stored in the ledger, or None."""
    names = {
        "execution_id": command.execution_id,
        "namespace": command.namespace,
        "session_id": command.session_id,
        "request_digest": command.request_digest,
    }
    if command.body is not None:
        body = command.body
        names |= {
            "turn_id": body.turn_id,
            "call_id": body.call_id,
            "tool": body.tool,
            "binding_digest": body.binding_digest,
        }
    for field, text in names.items():
        problem = unstorable(text)
        if problem is not None:
            return f"the command's {field} {problem}"
    return None


def short(digest: str) -> str:
    return f"{digest[:8]}…"


def unusable(command: ExecuteCommand, route: str, queue: str) -> str | None:
    """Why a resolved command (its body inline) is parked unread, or None."""
    body = command.body
    assert body is not None
    problem = unstorable_names(command)
    if problem is not None:
        return f"schema_error: {problem}"
    expected = request_digest(command.execution_id, body)
    if expected != command.request_digest:
        return (
            f"schema_error: request_digest {short(command.request_digest)} does not match "
            f"the command (sha256 of the canonical command is {short(expected)})"
        )
    if body.route != route:
        return f"routing_error: command for route {body.route} was delivered to {queue} (route {route})"
    return None
