"""An OpenAI Agents SDK agent whose tools a Hands pool serves: the five-email story's tools,
written with the SDK's own ``@function_tool``, made durable by the ``TENDON_TOOLS`` mapping.

    hands serve --route email --tools examples.framework_tools_openai_agents

``send_email`` is ``unsafe`` with the query ``find_sent_email``: after a crash inside its body the
mailbox is asked about the execution's operation id (the body's ``Idempotency-Key``, which the SDK
hands the tool as ``ctx.tool_call_id``); it is never sent again blindly. ``list_customers`` is
read-only, so ``safe``. The Pydantic AI example (``examples.framework_tools_pydantic_ai``) gives
the same policies with ``@policy``.
"""

from __future__ import annotations

import asyncio

from agents import Agent, function_tool
from agents.tool_context import ToolContext

from examples.email_tools import CUSTOMERS, MailboxError, find_sent_email, http_json, mailbox_url
from hands.tools.declare import current_context

__all__ = ["TENDON_TOOLS", "agent", "find_sent_email", "list_customers", "send_email"]


@function_tool
async def send_email(ctx: ToolContext[None], to: str, subject: str, body: str) -> dict:
    """Send one email through the mailbox; the operation id is its idempotency key."""
    await current_context().ensure_owner()  # not if this worker's work was handed over meanwhile
    url = f"{mailbox_url()}/messages"
    payload = {"to": to, "subject": subject, "body": body}
    key = {"Idempotency-Key": ctx.tool_call_id}
    status, receipt = await asyncio.to_thread(http_json, "POST", url, payload, key)
    if status in (200, 201) and isinstance(receipt, dict):
        return receipt
    raise MailboxError(f"mailbox answered {status} to POST {url}: {receipt!r}")


@function_tool
def list_customers() -> list[dict[str, str]]:
    """List the customers to notify (read-only)."""
    return [dict(c) for c in CUSTOMERS]


agent = Agent(
    name="notice-sender",
    instructions="Send the maintenance notice to each customer, one at a time.",
    tools=[send_email, list_customers],
)

TENDON_TOOLS = {
    "send_email": {"route": "email", "replay": "unsafe", "query": "find_sent_email"},
    "list_customers": {"route": "email", "replay": "safe"},
}
