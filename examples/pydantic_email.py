"""The five-email story's agent written with Pydantic AI, run durably by Tendon unchanged.

Its definition (``examples/pydantic_email.json``) names it and routes ``send_email`` to the Hands
pool that serves it: here ``examples.email_tools``, whose ``send_email`` has the same name and
parameters. A module whose tools have their real bodies can be served from itself instead
(``hands serve --tools MODULE``, each tool given its route and replay policy with ``@policy``:
``examples.framework_tools_pydantic_ai``, docs/framework-tools.md); the pool imports the module, so
its model's client must be constructible there too (``OPENAI_API_KEY`` set). The model is any
OpenAI-compatible API (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``); ``TENDON_EXAMPLE_MODEL`` names it.
"""

import os

from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel

agent = Agent(
    OpenAIChatModel(os.environ.get("TENDON_EXAMPLE_MODEL", "gpt-4o-mini")),
    instructions="Send the maintenance notice to customer1@example.com .. customer5@example.com, "
    "one email each, then list the receipts.",
)


@agent.tool_plain
async def send_email(to: str, subject: str, body: str) -> dict:
    """Send one email."""
    # On Tendon this call is a Hands execution (route `email`, its execution id the idempotency
    # key): the pool's `send_email` of the same name and parameters runs it, never this Brain.
    raise NotImplementedError("served by: hands serve --route email --tools examples.email_tools")
