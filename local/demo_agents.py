"""The five-email agent of `brain demo`: scripted (its replies are data, the default), or told by
a real model of an OpenAI-compatible API (``--model openai:NAME``)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from brain.rules.agents import AgentDefinition
from protocol import TendonError

# What `brain demo --agent MODULE:ATTR` passes on as its model: the story told by a framework's agent.
AGENT_KIND = "agent"
_FRAMEWORKS = {"pydantic_ai": "pydantic-ai", "agents": "openai-agents"}


def framework_agent(path: str) -> AgentDefinition:
    """The five-email story told by the agent at ``path``, written with Pydantic AI or the OpenAI
    Agents SDK: every tool of it is one the demo's email pool serves."""
    from brain.frameworks import load

    found = load(path)
    framework = _FRAMEWORKS.get(type(found).__module__.split(".")[0])
    if framework is None:
        raise TendonError(f"--agent {path} is not an agent of Pydantic AI or the OpenAI Agents SDK")
    if framework == "pydantic-ai":
        tools = [name for toolset in found.toolsets for name in getattr(toolset, "tools", {})]
    else:
        tools = [tool.name for tool in found.tools]
    return AgentDefinition.model_validate(
        {"name": "notice-sender", "version": f"1-{framework}", "framework": framework, "agent": path,
         "tools": sorted(tools), "limits": {"max_model_calls": 10}, "journal": "detailed"}
    )  # fmt: skip


def demo_agent(model: str | None) -> AgentDefinition:
    """The five-email agent: scripted (its replies are data), or ``openai:NAME``, a real model of
    an OpenAI-compatible API (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``) that must find the
    customers and send the notices itself."""
    scripted = AgentDefinition.model_validate_json(
        resources.files("examples").joinpath("notice_agent.json").read_text()
    )
    if model is None:
        return scripted
    kind, _, name = model.partition(":")
    if kind == AGENT_KIND:
        return framework_agent(name)
    if kind != "openai" or not name:
        raise TendonError(f"--model takes openai:NAME (a model of the API at OPENAI_BASE_URL), not {model!r}")
    return scripted.model_copy(
        update={
            "version": f"1-openai-{name}",
            "model": {"kind": "openai", "name": name},
            "instructions": OPENAI_INSTRUCTIONS,
            "tools": ["list_customers", "send_email"],
        }
    )


OPENAI_INSTRUCTIONS = (
    "You send a maintenance notice to every customer. First call list_customers. Then call "
    "send_email once per customer, one email per step, never twice to the same address, with the "
    "subject 'Service notice' and a body that greets the customer by name and says the service "
    "will be down for maintenance on Sunday. When all are sent, reply with a short summary that "
    "lists each customer's message_id."
)


def default_data_dir(model: str | None) -> Path:
    """Where a story is kept by default: one directory per model, so that each resumes its own."""
    return Path(".tendon/demo") if model is None else Path(".tendon") / f"demo-{model.replace(':', '-')}"
