"""The function tools of OpenAI Agents SDK agents, as the SDK itself defines and calls them.

Found: every module-level ``agents.Agent``'s ``FunctionTool`` objects and module-level
``FunctionTool`` objects. Not served: hosted tools (web search... run at the model's provider), an
agent used as a tool (``as_tool``: its run asks a model, which is the Brain's work) and MCP servers
(``hands serve --mcp`` serves those). A tool's
definition is the SDK's own: ``name``, ``description``, ``params_json_schema`` (already made strict
by the SDK when the tool is strict), what its model converters send. Arguments are checked against
that schema, then the SDK's ``on_invoke_tool(ToolContext, json_args)`` runs the tool, with a
``ToolContext`` whose ``context`` is ``None`` (or what the module's ``TENDON_DEPS`` makes) and whose
``tool_call_id`` is Tendon's operation id (stable across re-runs: an idempotency key).

An error a tool raises fails the execution, as with ``@tool``; the SDK's default, which turns it
into a text the model reads as a success, is left to the Brain. A tool given its own
``failure_error_function`` keeps it: its text is then the tool's result.

Results: a string stays a string, plain JSON data stays data, the SDK's structured outputs
(``ToolOutputText``, ``ToolOutputImage``...) travel as their JSON form, and anything else as the
``str()`` the SDK would send the model.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any

from agents import Agent, FunctionTool, ToolOutputFileContent, ToolOutputImage, ToolOutputText
from agents.tool import (
    default_tool_error_function,
    resolve_function_tool_failure_error_function,
    set_function_tool_failure_error_function,
)
from agents.tool_context import ToolContext as SdkToolContext
from agents.usage import Usage
from jsonschema import Draft202012Validator

from hands.tools.declare import ToolContext
from hands.tools.frameworks import Listed
from infra.process.logging import get_logger
from protocol import SchemaError

log = get_logger(__name__)
FRAMEWORK = "openai-agents"
Deps = Callable[[], Awaitable[Any]]
STRUCTURED = (ToolOutputText, ToolOutputImage, ToolOutputFileContent)


def _tools(values: Iterable[Any]) -> list[FunctionTool]:
    found: list[FunctionTool] = []
    for value in values:
        for tool in value.tools if isinstance(value, Agent) else [value]:
            if not isinstance(tool, FunctionTool) or any(tool is t for t in found):
                continue
            if getattr(tool, "_is_agent_tool", False):  # its run asks a model: the Brain's work
                log.info("framework_tool_not_served", tool=tool.name, why="an agent used as a tool")
                continue
            found.append(tool)
    return found


def _plain(value: Any) -> bool:
    """Whether ``value`` is JSON data already (so the SDK's ``str()`` of it survives a round trip)."""
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _result(value: Any) -> Any:
    if isinstance(value, STRUCTURED):
        return value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, list | tuple) and value and all(isinstance(v, STRUCTURED) for v in value):
        return [v.model_dump(mode="json", exclude_none=True) for v in value]
    return value if _plain(value) else str(value)


def _validate(tool: FunctionTool, args: dict[str, Any]) -> dict[str, Any]:
    errors = list(Draft202012Validator(tool.params_json_schema).iter_errors(args))
    if errors:
        detail = "; ".join(f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message}" for e in errors[:5])
        raise SchemaError(f"arguments for tool {tool.name!r} are invalid: {detail}")
    return dict(args)


def _raising(tool: FunctionTool) -> FunctionTool:
    """The tool, or a copy that raises where the SDK's default would answer the model a text."""
    if resolve_function_tool_failure_error_function(tool) is not default_tool_error_function:
        return tool
    raising = copy.copy(tool)  # the copy binds the invoker to itself, so its failure policy applies
    set_function_tool_failure_error_function(raising, None)
    return raising


async def _run(tool: FunctionTool, agent: Any, deps: Deps, ctx: ToolContext, args: dict[str, Any]) -> Any:
    text = json.dumps(args)
    context = SdkToolContext(
        context=await deps(), usage=Usage(), tool_name=tool.name, tool_call_id=ctx.operation_id,
        tool_arguments=text, agent=agent,
    )  # fmt: skip
    return _result(await tool.on_invoke_tool(context, text))


def listed(values: Iterable[Any], deps: Deps) -> list[Listed]:
    """The function tools of the agents (and module-level tools) among ``values``."""
    values = list(values)
    owners = {id(t): a for a in values if isinstance(a, Agent) for t in a.tools}
    out: list[Listed] = []
    for tool in _tools(values):
        out.append(
            Listed(
                framework=FRAMEWORK,
                name=tool.name,
                description=tool.description or "",
                schema=tool.params_json_schema,
                approval=tool.needs_approval is True,
                marks=(tool, getattr(tool, "__wrapped__", None)),
                run=partial(_run, _raising(tool), owners.get(id(tool)), deps),
                validate=partial(_validate, tool),
                source=tool,
            )
        )
    return out
