"""The five-email story's agent written with the OpenAI Agents SDK, run durably by Tendon unchanged.

Its definition (``examples/openai_agents_email.json``) names it and routes ``send_email`` to the
Hands pool that serves it (``examples.email_tools``). The model is any OpenAI-compatible
chat-completions API (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``); ``TENDON_EXAMPLE_MODEL`` names it.
"""

import os

from agents import Agent, OpenAIChatCompletionsModel, function_tool
from openai import AsyncOpenAI


@function_tool
async def send_email(to: str, subject: str, body: str) -> dict:
    """Send one email."""
    # On Tendon this call is a Hands execution (route `email`, its execution id the idempotency
    # key): the pool's `send_email` of the same name and parameters runs it, never this Brain.
    raise NotImplementedError("served by: hands serve --route email --tools examples.email_tools")


agent = Agent(
    name="notice-sender",
    instructions="Send the maintenance notice to customer1@example.com .. customer5@example.com, "
    "one email each, then list the receipts.",
    model=OpenAIChatCompletionsModel(
        model=os.environ.get("TENDON_EXAMPLE_MODEL", "gpt-4o-mini"), openai_client=AsyncOpenAI(max_retries=0)
    ),
    tools=[send_email],
)
