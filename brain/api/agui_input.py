"""What an AG-UI ``RunAgentInput`` asks of Tendon (``POST /v1/agui/run``), read with the
``ag-ui-protocol`` package's own model:

- a new input: its last message is the user's, the turn's input (submitted with the run id as its
  request id, so the same run sent again after a reconnect streams the same turn);
- frontend tools (``tools``: tools the client runs) join the agent as manual tools: the model
  calls them like any other, and the turn waits for their result, which no Hands pool gives;
  the agent is then versioned by its content (the same tools, the same version);
- answers: a ``tool`` message naming a call that waits (a frontend tool's result, as AG-UI clients
  send it), and ``resume`` entries (AG-UI's interrupts: ``resolved`` with a ``payload``, or
  ``cancelled``: a deny, for an approval and a frontend tool alike) each answer a call that waits
  for a person. The messages a client sends again every time (the whole conversation) answer
  nothing once their call was answered.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ag_ui.core import RunAgentInput
from pydantic import BaseModel, ValidationError

from brain.rules.agents import AgentDefinition, ManualTool
from brain.rules.submits import MAIN_THREAD
from protocol import SchemaError

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Asked:
    session_id: str  # the AG-UI thread id
    request_id: str  # the AG-UI run id
    thread: str  # the Tendon thread of the session (``forwardedProps.thread``, else main)
    agent: AgentDefinition
    text: str | None  # a new input, or None when the last message is no user's
    results: dict[str, Any] = field(default_factory=dict)  # call id -> a tool message's content
    resumes: dict[str, Any] = field(default_factory=dict)  # interrupt (call) id -> its answer
    cancelled: frozenset[str] = frozenset()  # interrupts (calls) the client gave up: denied


def asked(body: Any) -> Asked:
    """What a RunAgentInput asks, checked by its model (a wrong one is a SchemaError saying where)."""
    try:
        run = RunAgentInput.model_validate(body)
    except ValueError as exc:
        raise SchemaError(f"not an AG-UI RunAgentInput: {str(exc).splitlines()[0]}") from exc
    props = run.forwarded_props if isinstance(run.forwarded_props, dict) else {}
    if "agent" not in props:
        raise SchemaError("an AG-UI run names its Tendon agent in forwardedProps.agent (a definition)")
    agent = with_frontend_tools(
        _valid(AgentDefinition, props["agent"], "forwardedProps.agent"), run.tools or []
    )
    text = None
    if run.messages and run.messages[-1].role == "user":
        content = run.messages[-1].content
        text = content if isinstance(content, str) else "".join(getattr(p, "text", "") for p in content)
    results = {}
    for m in reversed(run.messages):  # the tool messages after the last message of another role
        if m.role != "tool":
            break
        results[m.tool_call_id] = _parsed(m.content)
    resumes = {r.interrupt_id: r.payload for r in run.resume or []}
    cancelled = frozenset(r.interrupt_id for r in run.resume or [] if r.status == "cancelled")
    if text is None and not results and not resumes:
        raise SchemaError("an AG-UI run needs a user message (the turn's input), a tool result or a resume")
    thread = str(props.get("thread") or MAIN_THREAD)
    return Asked(run.thread_id, run.run_id, thread, agent, text, results, resumes, cancelled)


def with_frontend_tools(agent: AgentDefinition, tools: list[Any]) -> AgentDefinition:
    """The agent with the client's tools as manual tools (those it has already stay its own)."""
    have = set(agent.tools) | {m.name for m in agent.manual_tools}
    added: list[ManualTool] = []
    for i, t in enumerate(tools):
        if t.name not in have:  # a tool the agent has, or one named twice, is the first
            have.add(t.name)
            schema = t.parameters or {"type": "object"}
            said = {"name": t.name, "description": t.description or "", "input_schema": schema}
            added.append(_valid(ManualTool, said, f"tools[{i}]"))
    if not added:
        return agent
    made = agent.model_dump(mode="json", exclude_unset=True)
    made["manual_tools"] = [m.model_dump(mode="json") for m in (*agent.manual_tools, *added)]
    return _valid(AgentDefinition, made, "forwardedProps.agent with tools").versioned_by_content()


def _valid(model: type[M], value: Any, where: str) -> M:
    """``value`` read as ``model``, or a SchemaError saying where it is not one (never a 500)."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        place = ".".join(str(p) for p in (where, *first["loc"]))
        raise SchemaError(f"{place[:200]}: {first['msg']}") from None


def _parsed(content: Any) -> Any:
    """A tool message's content: the JSON it holds, or the text itself."""
    if not isinstance(content, str):
        return content
    try:
        return json.loads(content)
    except ValueError:
        return content
