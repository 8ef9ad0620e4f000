"""Pydantic AI agents that the framework tests run on a Brain (``tests/test_frameworks_pydantic_ai.py``).

Their model is the framework's own OpenAI chat model, pointed (by ``OPENAI_BASE_URL``, read when
the Brain imports this module) at the tests' local chat-completions server. Their tools have the
names and parameters of the ``@tool`` functions the Hands pools serve (``examples.email_tools``,
``tests.brain_e2e_tools``): the Brain never runs them, it sends them.
"""

from __future__ import annotations

import itertools

from openai import AsyncOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider


def _model() -> OpenAIChatModel:
    return OpenAIChatModel("test-model")


notice = Agent(_model(), instructions="Send the maintenance notice to each customer, then list the receipts.")


@notice.tool_plain
async def send_email(to: str, subject: str, body: str) -> dict:  # type: ignore[type-arg]
    """Send one email."""
    raise AssertionError("a Brain never runs a Hands tool itself")


steps = Agent(_model(), instructions="Do the steps.")


@steps.tool_plain
async def slow_step(seconds: float, label: str = "step", gate: str = "") -> dict:  # type: ignore[type-arg]
    """Take some time."""
    raise AssertionError("a Brain never runs a Hands tool itself")


@steps.tool_plain
def shout(text: str) -> str:
    """A pure tool the definition runs in the Brain (local_tools)."""
    return text.upper()


chatty = Agent(_model(), instructions="Answer briefly.")

approved = Agent(_model(), instructions="Send the email once a person approves it.")


@approved.tool_plain(name="send_email", requires_approval=True)
async def send_email_approved(to: str, subject: str, body: str) -> dict:  # type: ignore[type-arg]
    raise AssertionError("a Brain never runs a Hands tool itself")


_counter = itertools.count()
drifting = Agent(_model())


@drifting.instructions
def _drifting_instructions() -> str:
    # Breaks the replay rule: a different prompt in every run of the turn.
    return f"You are run number {next(_counter)}."


@drifting.tool_plain(name="slow_step")
async def slow_step_drifting(seconds: float) -> dict:  # type: ignore[type-arg]
    raise AssertionError("a Brain never runs a Hands tool itself")


class Weight(BaseModel):
    value: int
    unit: str


measured = Agent(_model(), output_type=Weight, instructions="Say how heavy it is.")


def _unretried() -> OpenAIChatModel:
    # The client tries once: Tendon's retry policy decides, and every attempt is in the history.
    return OpenAIChatModel("test-model", provider=OpenAIProvider(openai_client=AsyncOpenAI(max_retries=0)))


retrying = Agent(_unretried(), instructions="Answer briefly.")


blobs = Agent(_model(), instructions="Echo the blob.")


@blobs.tool_plain
async def echo_blob(blob: str) -> dict:  # type: ignore[type-arg]
    """Return the blob."""
    raise AssertionError("a Brain never runs a Hands tool itself")


measured_once = Agent(_unretried(), output_type=Weight, instructions="Say how heavy it is.")
