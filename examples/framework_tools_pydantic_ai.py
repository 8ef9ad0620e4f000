"""A Pydantic AI agent whose tools a Hands pool serves: the five-email story's tools, written in the
framework's own terms (``@agent.tool_plain``), made durable by a route and a replay policy.

    hands serve --route email --tools examples.framework_tools_pydantic_ai

``send_email`` is ``unsafe`` with a query: after a crash inside its body it is never sent again
blindly; ``find_sent_email`` asks the mailbox about the execution's operation id, which the body
sends as its ``Idempotency-Key`` (``current_context().operation_id``). ``list_customers`` is
read-only, so ``safe``: run again after a crash. The policies are given here by ``@policy``; the
OpenAI Agents SDK example (``examples.framework_tools_openai_agents``) gives them by a mapping.
"""

from __future__ import annotations

import asyncio

from pydantic_ai import Agent

from examples.email_tools import CUSTOMERS, MailboxError, find_sent_email, http_json, mailbox_url
from hands.tools.declare import current_context, policy

__all__ = ["agent", "list_customers", "send_email"]

agent = Agent(
    "test",  # the Brain picks the model; the Hands never call one
    name="notice-sender",
    instructions="Send the maintenance notice to each customer, one at a time.",
)


@agent.tool_plain
@policy(route="email", replay="unsafe", query=find_sent_email)
async def send_email(to: str, subject: str, body: str) -> dict:
    """Send one email through the mailbox; the operation id is its idempotency key."""
    ctx = current_context()
    await ctx.output.write(f"sending {subject!r} to {to} (operation {ctx.operation_id})\n")
    await ctx.ensure_owner()  # not if this worker was frozen and its work handed over meanwhile
    url = f"{mailbox_url()}/messages"
    payload = {"to": to, "subject": subject, "body": body}
    key = {"Idempotency-Key": ctx.operation_id}
    status, receipt = await asyncio.to_thread(http_json, "POST", url, payload, key)
    if status in (200, 201) and isinstance(receipt, dict):
        return receipt
    raise MailboxError(f"mailbox answered {status} to POST {url}: {receipt!r}")


@agent.tool_plain
@policy(route="email", replay="safe")
def list_customers() -> list[dict[str, str]]:
    """List the customers to notify (read-only)."""
    return [dict(c) for c in CUSTOMERS]
