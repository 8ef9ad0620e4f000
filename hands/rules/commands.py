"""Reading a command: what makes it unusable before anything is recorded of it (names the
ledger cannot store, a request digest that does not match the command, a route that is not this
pool's: such a command is parked with the reason these return, since redelivery would not help),
and the ledger row it makes."""

from __future__ import annotations

from typing import Any

from protocol import ExecuteCommand, request_digest
from protocol.storable import unstorable


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


def unusable(command: ExecuteCommand, route: str, queue: str, *, names_checked: bool = False) -> str | None:
    """Why a resolved command (its body inline) is parked unread, or None. ``names_checked``: its
    names were found storable already (a command that came with its body inline)."""
    body = command.body
    assert body is not None
    problem = None if names_checked else unstorable_names(command)
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


def row_values(
    header: ExecuteCommand, command: ExecuteCommand | None, route: str, owner: str
) -> dict[str, Any]:
    """The ledger row's names for a command (``command``: with its body resolved, when it is)."""
    body = command.body if command is not None else None
    values: dict[str, Any] = {
        "execution_id": header.execution_id,
        "route": route,
        "request_digest": header.request_digest,
        "namespace": header.namespace,
        "session_id": header.session_id,
        "owner": owner,
    }
    if body is not None:
        values |= {
            "turn_id": body.turn_id,
            "call_id": body.call_id,
            "tool": body.tool,
            "binding_digest": body.binding_digest,
        }
    return values
