"""The function tools of Pydantic AI agents, as the framework itself defines and calls them.

Found: every module-level ``pydantic_ai`` agent's toolsets (its own ``@agent.tool`` /
``@agent.tool_plain`` / ``tools=[...]`` and the ``FunctionToolset`` objects given as
``toolsets=[...]``), and module-level ``FunctionToolset`` objects. A tool's definition is the
framework's ``Tool.tool_def`` (name, description, ``parameters_json_schema``): what the model is
shown. Arguments are validated by the tool's own validator and the call goes through
``FunctionToolset.call_tool``, as Pydantic AI's durable backends do inside their units.

A tool that takes ``RunContext`` gets a :class:`HandsRunContext`: ``deps`` (``None``, or what the
module's ``TENDON_DEPS`` makes), ``tool_name``, ``tool_call_id`` (Tendon's operation id, stable
across re-runs: an idempotency key), ``retry`` 0 and an empty ``usage``. Reading any other field
(the messages, the model, the prompt...) raises an error that says so: the run lives in the
Brain, not here. Results travel as the JSON Pydantic AI sends the model (``tool_return_ta``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any

from pydantic import ValidationError
from pydantic_ai import FunctionToolset
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.durable_exec import DurableRunContext
from pydantic_ai.messages import tool_return_ta
from pydantic_ai.tools import Tool as PaiTool
from pydantic_ai.usage import RunUsage

from hands.tools.declare import ToolContext
from hands.tools.frameworks import Listed
from protocol import SchemaError

FRAMEWORK = "pydantic-ai"
Deps = Callable[[], Awaitable[Any]]


class HandsRunContext(DurableRunContext[Any]):
    """The ``RunContext`` of a Pydantic AI tool run by a Hands pool: what crosses from the Brain."""

    def unavailable_field_message(self, name: str) -> str:
        return (
            f"RunContext.{name} is not available to a Pydantic AI tool run by a Tendon Hands pool: "
            "it gets deps (the module's TENDON_DEPS), tool_name, tool_call_id (the operation id), "
            "retry and usage; pass what else the tool needs as an argument"
        )


def _toolsets(values: Iterable[Any]) -> list[FunctionToolset[Any]]:
    found: list[FunctionToolset[Any]] = []

    def keep(toolset: Any) -> None:
        if isinstance(toolset, FunctionToolset) and not any(toolset is t for t in found):
            found.append(toolset)

    for value in values:
        if isinstance(value, AbstractAgent):
            for toolset in value.toolsets:
                toolset.apply(keep)  # the leaves under wrappers (prefixed, filtered...)
        elif isinstance(value, FunctionToolset):
            keep(value)
    return found


def _validate(tool: PaiTool[Any], args: dict[str, Any]) -> dict[str, Any]:
    try:
        checked = tool.function_schema.validator.validate_python(args)
    except ValidationError as exc:
        detail = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise SchemaError(f"arguments for tool {tool.name!r} are invalid: {detail}") from exc
    return dict(checked)


async def _run(
    toolset: FunctionToolset[Any], tool: PaiTool[Any], deps: Deps, ctx: ToolContext, args: dict[str, Any]
) -> Any:
    run = HandsRunContext(
        deps=await deps(), tool_name=tool.name, tool_call_id=ctx.operation_id, retry=0,
        max_retries=tool.max_retries or 1, usage=RunUsage(), tool_call_approved=bool(tool.requires_approval),
    )  # fmt: skip
    built = toolset.tool_for_tool_def(tool.tool_def, ctx=run, original_name=tool.name)
    value = await toolset.call_tool(tool.name, args, run, built)
    return value if isinstance(value, str) else tool_return_ta.dump_python(value, mode="json", by_alias=True)


def listed(values: Iterable[Any], deps: Deps) -> list[Listed]:
    """The function tools of the agents and toolsets among ``values``."""
    out: list[Listed] = []
    for toolset in _toolsets(values):
        for tool in toolset.tools.values():
            definition = tool.tool_def
            out.append(
                Listed(
                    framework=FRAMEWORK,
                    name=definition.name,
                    description=definition.description or "",
                    schema=definition.parameters_json_schema,
                    approval=bool(tool.requires_approval),
                    marks=(tool, tool.function),
                    run=partial(_run, toolset, tool, deps),
                    validate=partial(_validate, tool),
                    source=tool,
                )
            )
    return out
