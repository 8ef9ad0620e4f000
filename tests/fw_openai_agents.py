"""OpenAI Agents SDK agents that the framework tests run on a Brain
(``tests/test_frameworks_openai_agents.py``): the SDK's chat-completions model over the official
client, which reads ``OPENAI_BASE_URL`` (the tests' local server). Their tools have the names and
parameters of the ``@tool`` functions the Hands pools serve: the Brain never runs them."""

from __future__ import annotations

import itertools

from agents import Agent, OpenAIChatCompletionsModel, function_tool
from openai import AsyncOpenAI


def _model() -> OpenAIChatCompletionsModel:
    return OpenAIChatCompletionsModel(model="test-model", openai_client=AsyncOpenAI(max_retries=0))


@function_tool
async def send_email(to: str, subject: str, body: str) -> dict:  # type: ignore[type-arg]
    """Send one email."""
    raise AssertionError("a Brain never runs a Hands tool itself")


@function_tool
async def slow_step(seconds: float, label: str = "step", gate: str = "") -> dict:  # type: ignore[type-arg]
    """Take some time."""
    raise AssertionError("a Brain never runs a Hands tool itself")


@function_tool
def shout(text: str) -> str:
    """A pure tool the definition runs in the Brain (local_tools)."""
    return text.upper()


@function_tool(name_override="send_email", needs_approval=True)
async def send_email_approved(to: str, subject: str, body: str) -> dict:  # type: ignore[type-arg]
    """Send one email, once a person approves it."""
    raise AssertionError("a Brain never runs a Hands tool itself")


notice = Agent(
    name="notice", instructions="Send the notice to each customer.", model=_model(), tools=[send_email]
)
steps = Agent(name="steps", instructions="Do the steps.", model=_model(), tools=[slow_step, shout])
chatty = Agent(name="chatty", instructions="Answer briefly.", model=_model())
approved = Agent(
    name="approved", instructions="Send it once approved.", model=_model(), tools=[send_email_approved]
)

_counter = itertools.count()


def _drifting(context: object, agent: object) -> str:
    return f"You are run number {next(_counter)}."  # breaks the replay rule


drifting = Agent(name="drifting", instructions=_drifting, model=_model(), tools=[slow_step])
