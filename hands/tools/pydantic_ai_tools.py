"""The function tools of Pydantic AI agents, as the framework itself defines and calls them.

Found: every module-level ``pydantic_ai`` agent's toolsets made of function tools (its own
``@agent.tool`` / ``@agent.tool_plain`` / ``tools=[...]`` and the ``FunctionToolset`` objects given
as ``toolsets=[...]``, under prefixing, renaming or filtering wrappers too), and module-level
``FunctionToolset`` objects no agent holds. The tools are listed by the framework itself
(``get_tools``, once, at start): a definition is the ``ToolDefinition`` a model is shown, its name
the one the model calls (``geo_area`` for ``area`` under ``prefixed("geo")``). Arguments are
validated by the tool's own validator and the call goes through the toolset's ``call_tool``, as
Pydantic AI's durable backends do inside their units.

A tool that takes ``RunContext`` gets a :class:`HandsRunContext`: ``deps`` (``None``, or what the
module's ``TENDON_DEPS`` makes), ``tool_name``, ``tool_call_id`` (Tendon's operation id, stable
across re-runs: an idempotency key), ``retry`` 0 and an empty ``usage``. Reading any other field
(the messages, the model, the prompt...) raises an error that says so: the run lives in the
Brain, not here. Results travel as the JSON Pydantic AI sends the model (``tool_return_ta``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from pydantic import ValidationError
from pydantic_ai import FunctionToolset
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.durable_exec import DurableRunContext
from pydantic_ai.messages import tool_return_ta
from pydantic_ai.tools import Tool as PaiTool
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
from pydantic_ai.usage import RunUsage

from hands.tools.declare import ToolContext
from hands.tools.frameworks import Listed
from hands.tools.registry import ToolLoadError
from infra.process.logging import get_logger
from protocol import SchemaError
from protocol.storable import describe

log = get_logger(__name__)
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


def _leaves(toolset: AbstractToolset[Any]) -> list[AbstractToolset[Any]]:
    found: list[AbstractToolset[Any]] = []
    toolset.apply(found.append)  # under the wrappers (prefixed, renamed, filtered...)
    return found


def _served(values: list[Any]) -> list[AbstractToolset[Any]]:
    """The agents' toolsets made only of function tools (an MCP server there is left to ``--mcp``),
    then the module's function toolsets no agent holds."""
    served: list[AbstractToolset[Any]] = []
    held: list[AbstractToolset[Any]] = []
    for agent in (v for v in values if isinstance(v, AbstractAgent)):
        for toolset in agent.toolsets:
            leaves = _leaves(toolset)
            held += leaves
            if all(isinstance(leaf, FunctionToolset) for leaf in leaves):
                served.append(toolset)
            else:
                log.info("framework_toolset_not_served", toolset=toolset.label, why="not only function tools")
    for value in values:
        if isinstance(value, FunctionToolset) and not any(value is h for h in held + served):
            served.append(value)
    return served


def _context(deps: Any, name: str | None, call_id: str | None, approved: bool = False) -> HandsRunContext:
    return HandsRunContext(
        deps=deps, tool_name=name, tool_call_id=call_id, retry=0, retries={}, max_retries=1,
        run_step=0, usage=RunUsage(), tool_call_approved=approved,
    )  # fmt: skip


async def _listing(toolsets: list[AbstractToolset[Any]], deps: Deps) -> list[tuple[Any, ToolsetTool[Any]]]:
    """Each toolset's tools as the framework lists them for a model (names as exposed)."""
    ctx = _context(await deps(), None, None)
    listed: list[tuple[Any, ToolsetTool[Any]]] = []
    for ts in toolsets:
        try:
            listed += [(ts, tool) for tool in (await ts.get_tools(ctx)).values()]
        except Exception as exc:  # a prepare function or filter of the user's, say
            said = f"Pydantic AI could not list the tools of {ts.label}: {describe(exc)}"
            raise ToolLoadError(said) from exc
    return listed


def _resolved(work: Coroutine[Any, Any, Any]) -> Any:
    """Run ``work`` to its end from sync code, inside a running event loop or not."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    with ThreadPoolExecutor(1) as aside:  # a loop runs here (a pool starting): list on another
        return aside.submit(asyncio.run, work).result()


def _validate(tool: ToolsetTool[Any], args: dict[str, Any]) -> dict[str, Any]:
    try:
        checked = tool.args_validator.validate_python(args)
    except ValidationError as exc:
        detail = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise SchemaError(f"arguments for tool {tool.tool_def.name!r} are invalid: {detail}") from exc
    return dict(checked)


async def _run(
    toolset: AbstractToolset[Any], tool: ToolsetTool[Any], approved: bool, deps: Deps, ctx: ToolContext,
    args: dict[str, Any],
) -> Any:  # fmt: skip
    name = tool.tool_def.name
    run = _context(await deps(), name, ctx.operation_id, approved)
    value = await toolset.call_tool(name, args, run, tool)
    return value if isinstance(value, str) else tool_return_ta.dump_python(value, mode="json", by_alias=True)


def _own(toolset: AbstractToolset[Any], tool: ToolsetTool[Any]) -> PaiTool[Any] | None:
    """The ``Tool`` object behind a listed tool (where a ``@policy`` may be), if one leaf holds it."""
    name = getattr(tool, "original_name", None) or tool.tool_def.name
    owners = [
        leaf.tools[name]
        for leaf in _leaves(toolset)
        if isinstance(leaf, FunctionToolset) and name in leaf.tools
    ]
    return owners[0] if len(owners) == 1 else None


def listed(values: Iterable[Any], deps: Deps) -> list[Listed]:
    """The function tools of the agents and toolsets among ``values``."""
    out: list[Listed] = []
    for toolset, tool in _resolved(_listing(_served(list(values)), deps)):
        own = _own(toolset, tool)
        definition = tool.tool_def
        approval = bool(own is not None and own.requires_approval)
        out.append(
            Listed(
                framework=FRAMEWORK,
                name=definition.name,
                description=definition.description or "",
                schema=definition.parameters_json_schema,
                approval=approval,
                marks=(own, own.function) if own is not None else (),
                run=partial(_run, toolset, tool, approval, deps),
                validate=partial(_validate, tool),
                source=own if own is not None else tool,
            )
        )
    return out
