"""The chaos run's tools (route ``chaos``): three contracts over one counting service.

Each calls the example mailbox (``examples.mailbox``), which counts every POST per
idempotency key (the operation id), so the run can tell a blind re-send from a verified one:

- ``touch``: safe; re-running it is allowed, so re-runs are counted, never called duplicates;
- ``send``: unsafe with a query (the mailbox is asked whether the operation happened);
- ``send_blind``: unsafe without a query, against a mailbox that cannot be asked
  (``--no-lookup``): a crash inside it makes the execution UNKNOWN, never re-sent.

Each holds ``hold`` seconds before and after its call, so that faults land inside tools.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any
from urllib.parse import quote

from examples.email_tools import MailboxError, http_json
from hands import Found, NotFound, ToolContext, tool


def _url(name: str) -> str:
    return os.environ[name].rstrip("/")


async def _post(ctx: ToolContext, base: str, hold: float) -> dict[str, Any]:
    await asyncio.sleep(hold)
    await ctx.ensure_owner()  # a worker frozen in the hold and taken over meanwhile stops here
    message = {"to": "chaos@example.com", "subject": ctx.operation_id, "body": "chaos"}
    status, receipt = await asyncio.to_thread(
        http_json, "POST", f"{base}/messages", message, {"Idempotency-Key": ctx.operation_id}
    )
    if status not in (200, 201) or not isinstance(receipt, dict):
        raise MailboxError(f"mailbox answered {status}: {receipt!r}")
    await asyncio.sleep(hold)
    return {"receipt": receipt.get("id"), "attempt": ctx.attempt}


@tool(route="chaos", version="1", replay="safe")
async def touch(ctx: ToolContext, hold: float = 0.3) -> dict:
    """Safe: posts under its operation id (a re-run posts again)."""
    return await _post(ctx, _url("CHAOS_MAILBOX_URL"), hold)


async def find_sent(ctx: ToolContext, hold: float = 0.3) -> Found | NotFound:
    url = f"{_url('CHAOS_MAILBOX_URL')}/messages/by-key/{quote(ctx.operation_id, safe='')}"
    status, answer = await asyncio.to_thread(http_json, "GET", url)
    if status == 200:
        return Found({"receipt": answer.get("id") if isinstance(answer, dict) else None, "attempt": 1})
    if status == 404:
        return NotFound()
    raise MailboxError(f"cannot tell whether {ctx.operation_id} was sent: {status}")


@tool(route="chaos", version="1", replay="unsafe", query=find_sent)
async def send(ctx: ToolContext, hold: float = 0.3) -> dict:
    """Unsafe, with a query: after a crash inside, the mailbox is asked."""
    return await _post(ctx, _url("CHAOS_MAILBOX_URL"), hold)


@tool(route="chaos", version="1", replay="unsafe")
async def send_blind(ctx: ToolContext, hold: float = 0.3) -> dict:
    """Unsafe, no query: after a crash inside, nothing is guessed (UNKNOWN)."""
    return await _post(ctx, _url("CHAOS_BLIND_MAILBOX_URL"), hold)
