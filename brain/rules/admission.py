"""What a submit is checked for before anything is written: the agent's model kind is one a Brain
has, and every tool it names is one some Hands pool has announced (or one it says is expected
later). A misspelt name is refused at once, saying what can be named, instead of a turn that
waits for a pool that never comes and fails a minute later.

A tool that is known but that nobody serves right now is no refusal: its pool may be restarting,
and the turn waits for it (the submit warns, ``brain.verbs.tools``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Collection

from brain.models.base import MODEL_KINDS
from brain.rules.agents import AgentDefinition
from brain.rules.batches import NAME as BATCH
from brain.rules.waits import NAMES as WAITS
from protocol import SchemaError, UnknownToolError

# The package each framework's agents need, and the extra that installs it.
FRAMEWORK_PACKAGES = {
    "pydantic-ai": ("pydantic_ai", "pydantic-ai"),
    "openai-agents": ("agents", "openai-agents"),
}


def check_model(agent: AgentDefinition) -> None:
    """SchemaError when the agent's model names a kind no Brain has (or a framework this
    installation lacks)."""
    if agent.framework is not None:
        package, extra = FRAMEWORK_PACKAGES[agent.framework]
        if importlib.util.find_spec(package) is None:
            raise SchemaError(
                f"agent {agent.name} is a {agent.framework} agent, and this Brain does not have "
                f"{agent.framework} installed: pip install 'tendon[{extra}]'"
            )
        return
    kind = agent.model.get("kind")
    if kind not in MODEL_KINDS:
        raise SchemaError(
            f"agent {agent.name} names model kind {kind!r}, which no Brain has "
            f"(the kinds: {', '.join(MODEL_KINDS)})"
        )
    for delegate in agent.delegates.values():  # a child's, refused with its lead, not a minute later
        check_model(delegate.agent)


def pool_tools(agent: AgentDefinition) -> list[str]:
    """The tools of ``agent`` a Hands pool must announce (a person answers its manual tools, and
    the Brain its built-ins: ``brain.rules.waits``, ``brain.rules.batches``), its delegates'
    agents' included."""
    manual = {m.name for m in agent.manual_tools}
    own = [t for t in agent.tools if t not in manual and t not in WAITS and t != BATCH]
    below = [t for d in agent.delegates.values() for t in pool_tools(d.agent)]
    return own + sorted(set(below) - set(own))


def _expected(agent: AgentDefinition) -> set[str]:
    return set(agent.expect_tools).union(*(_expected(d.agent) for d in agent.delegates.values()))


def unknown_tools(agent: AgentDefinition, known: Collection[str], *, expect: bool) -> list[str]:
    """The tools of ``agent`` a submit refuses: no pool announced them (they are not ``known``),
    the agent does not list them in ``expect_tools`` and the submit does not ``expect`` tools."""
    if expect:
        return []
    expected = _expected(agent)
    return sorted({t for t in pool_tools(agent) if t not in known and t not in expected})


def refusal(
    agent: AgentDefinition, unknown: list[str], known: Collection[str], *, served_here: bool
) -> UnknownToolError:
    """The error of a submit that names ``unknown`` tools, listing the ``known`` ones (those this
    server serves itself, when ``served_here``: a local server knows its pools)."""
    which = "this server serves" if served_here else "Hands pools have announced"
    listed = ", ".join(sorted(known)) or "none"
    return UnknownToolError(
        f"agent {agent.name} names tool(s) {', '.join(unknown)} that no Hands pool has announced "
        f"(the tools {which}: {listed}); if a pool will serve them later, submit with "
        "--expect-tools (`expect_tools: true`) or list them in the agent's expect_tools",
        unknown=unknown,
        known=sorted(known),
    )
