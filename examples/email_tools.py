"""Tools for the Hands pool of route ``email``, talking to the example mailbox service.

``send_email`` is declared ``replay="unsafe"``: if a worker dies while it runs, nobody can
tell from the inside whether the mailbox accepted the message. Running it again could send
a second email, so Tendon never re-runs it after a crash (invariant 6).

Instead it carries a ``query``, ``find_sent_email``. Every send uses the execution's stable
operation id as its ``Idempotency-Key``, and the query asks the mailbox about *that* key:

- ``Found(receipt)``: the original send was accepted; its receipt becomes the result and
  nothing is sent again (the fourth email of the five-email story);
- ``NotFound()``: the mailbox never saw the operation, so it is safe to run it now;
- an exception (the mailbox cannot be queried, answers 503, is unreachable...): the answer
  is "cannot know", and the execution stays UNKNOWN until someone reconciles it with
  evidence. The query never guesses.

``list_customers`` is read-only and declared ``replay="safe"``: running it twice is harmless.

The mailbox URL is read from ``TENDON_MAILBOX_URL`` (default ``http://127.0.0.1:8025``)
each time a tool runs, not at import.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from hands.tools.declare import Found, NotFound, ToolContext, tool

__all__ = [
    "DEFAULT_MAILBOX_URL",
    "TOOLS",
    "MailboxError",
    "find_sent_email",
    "list_customers",
    "send_email",
]

DEFAULT_MAILBOX_URL = "http://127.0.0.1:8025"
_TIMEOUT = 10.0

CUSTOMERS: tuple[dict[str, str], ...] = tuple(
    {"name": f"Customer {n}", "email": f"customer{n}@example.com"} for n in range(1, 6)
)


class MailboxError(RuntimeError):
    """The mailbox could not be reached or gave an answer we cannot interpret."""


def mailbox_url() -> str:
    return (os.environ.get("TENDON_MAILBOX_URL") or DEFAULT_MAILBOX_URL).rstrip("/")


def http_json(
    method: str, url: str, payload: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """One blocking HTTP exchange; returns (status, decoded JSON or None). Run in a thread."""
    data = json.dumps(payload).encode("utf-8") if payload is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        req.add_header(name, value)
    try:
        with urllib.request.urlopen(req, timeout=_TIMEOUT) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            status, raw = exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise MailboxError(f"{method} {url}: mailbox unreachable: {reason}") from exc
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = None
    return status, body


def _error_text(body: Any) -> str:
    if isinstance(body, dict) and "error" in body:
        return str(body["error"])
    return repr(body)


async def find_sent_email(ctx: ToolContext, to: str, subject: str, body: str) -> Found | NotFound:
    """Ask the mailbox whether the send with this operation id was accepted.

    Raises ``MailboxError`` when the mailbox cannot answer: that means "cannot know".
    """
    url = f"{mailbox_url()}/messages/by-key/{quote(ctx.operation_id, safe='')}"
    status, answer = await asyncio.to_thread(http_json, "GET", url)
    if status == 200 and isinstance(answer, dict):
        if answer.get("idempotency_key") != ctx.operation_id or answer.get("to") != to:
            raise MailboxError(
                f"mailbox receipt for operation {ctx.operation_id!r} does not match "
                f"this send (to={to!r}): {answer!r}"
            )
        return Found(answer)
    if status == 404:
        return NotFound()
    raise MailboxError(
        f"cannot tell whether operation {ctx.operation_id!r} was sent: mailbox answered "
        f"{status} to GET {url}: {_error_text(answer)}"
    )


@tool(route="email", version="1", replay="unsafe", query=find_sent_email)
async def send_email(ctx: ToolContext, to: str, subject: str, body: str) -> dict:
    """Send one email through the mailbox; the operation id is its idempotency key."""
    await ctx.output.write(f"sending {subject!r} to {to} (operation {ctx.operation_id})\n")
    await ctx.ensure_owner()  # not if this worker was frozen and its work handed over meanwhile
    url = f"{mailbox_url()}/messages"
    status, receipt = await asyncio.to_thread(
        http_json,
        "POST",
        url,
        {"to": to, "subject": subject, "body": body},
        {"Idempotency-Key": ctx.operation_id},
    )
    if status in (200, 201) and isinstance(receipt, dict):
        return receipt
    raise MailboxError(f"mailbox answered {status} to POST {url}: {_error_text(receipt)}")


@tool(route="email", version="1", replay="safe")
async def list_customers(ctx: ToolContext) -> list[dict]:
    """List the customers to notify (read-only)."""
    return [dict(c) for c in CUSTOMERS]


TOOLS = (list_customers, send_email)
