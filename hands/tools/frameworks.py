"""Agent frameworks' tools as a source of tools: the function tools of the Pydantic AI agents and
OpenAI Agents SDK agents a ``--tools`` module defines become :class:`Tool` objects like those
declared with ``@tool``, so a pool runs, records and recovers them the same way.

Binding: the framework's own definition (name, description, the JSON Schema it shows the model);
the version is a digest of that definition unless the policy names one, so a changed tool
announces a new binding. Policy, per tool, from ``@policy(...)`` on the tool or from the module's
``TENDON_TOOLS`` mapping (never both)::

    TENDON_TOOLS = {"send_email": {"route": "email", "replay": "unsafe", "query": "find_sent_email"}}

``route`` defaults to the module's ``TENDON_ROUTE``, else ``agents``; ``replay`` defaults to
``unsafe`` (after a crash inside the body: its ``query`` if it has one, else UNKNOWN); ``query``
is an async function or the name of one in the module; ``approval`` defaults to the framework's
own flag. A tool is served only by the pool of its route. A mapping that names a tool no agent
has, or a policy that cannot be, stops the pool at start with one line saying which.

The framework is imported only when the module itself imported it (each is an optional extra).
"""

from __future__ import annotations

import asyncio
import inspect
import re
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hands.tools.declare import POLICY_ATTRIBUTE, Policy, QueryFn, Tool, ToolContext, context_for
from hands.tools.registry import ToolLoadError
from protocol import ReplayPolicy, ToolBinding, digest

DEFAULT_ROUTE = "agents"
ROUTE = r"^[a-z0-9][a-z0-9_-]*$"


@dataclass(frozen=True)
class Listed:
    """One tool as its framework shows it to the model, and how to run it."""

    framework: str
    name: str
    description: str
    schema: dict[str, Any]
    approval: bool  # the framework's own "ask a person first"
    marks: tuple[object, ...]  # the objects a @policy may mark: the tool, its function
    run: Callable[[ToolContext, dict[str, Any]], Coroutine[Any, Any, Any]]
    validate: Callable[[dict[str, Any]], dict[str, Any]]
    source: object  # the framework's tool object: seen through two agents, served once


@dataclass(frozen=True)
class FrameworkTool(Tool):
    """A framework's tool, its arguments checked by the framework's own rules."""

    framework: str = ""
    checker: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def validate_args(self, args: dict[str, Any]) -> dict[str, Any]:
        assert self.checker is not None
        return self.checker(args)


class _Entry(BaseModel):
    """One ``TENDON_TOOLS`` entry."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    route: str | None = Field(default=None, pattern=ROUTE)
    replay: ReplayPolicy = ReplayPolicy.UNSAFE
    query: str | Callable[..., Any] | None = None
    version: str | None = Field(default=None, min_length=1)
    approval: bool | None = None


async def _run(one: Listed, ctx: ToolContext, **args: Any) -> Any:
    """Run the framework's tool in a task that sees ``ctx`` (``current_context()``); a cancel asked
    while it runs interrupts it, as a framework tool cannot watch ``ctx.cancelled`` itself."""
    call = asyncio.create_task(one.run(ctx, args), context=context_for(ctx))
    asked = asyncio.create_task(ctx.cancelled.wait())
    try:
        await asyncio.wait([call, asked], return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        call.cancel()  # the body itself is cancelled (a drain out of grace): its call must stop too
        raise
    finally:
        asked.cancel()
    if not call.done():
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        if call.cancelled():
            raise asyncio.CancelledError(f"cancel requested: {one.framework} tool {one.name} was interrupted")
    return call.result()


def _deps(module: ModuleType, spec: str) -> Callable[[], Awaitable[Any]]:
    factory = getattr(module, "TENDON_DEPS", None)
    if factory is not None and not callable(factory):
        raise ToolLoadError(f"TENDON_DEPS in {spec} must be a function that returns the deps")

    async def make() -> Any:
        value = factory() if factory is not None else None
        return await value if inspect.isawaitable(value) else value

    return make


def _listed(module: ModuleType, spec: str) -> list[Listed]:
    values, deps, found = list(vars(module).values()), _deps(module, spec), []
    if "pydantic_ai" in sys.modules:  # the module (or what it imports) uses Pydantic AI
        from hands.tools import pydantic_ai_tools

        found += pydantic_ai_tools.listed(values, deps)
    sdk = sys.modules.get("agents")
    if sdk is not None and hasattr(sdk, "FunctionTool"):  # the OpenAI Agents SDK, not a namesake
        from hands.tools import openai_agents_tools

        found += openai_agents_tools.listed(values, deps)
    unique: dict[str, Listed] = {}
    for one in found:
        known = unique.setdefault(one.name, one)
        if known.source is not one.source:
            raise ToolLoadError(
                f"tools module {spec} has two different tools named {one.name} "
                f"({known.framework} and {one.framework}): rename one"
            )
    return list(unique.values())


def _mapped(module: ModuleType, spec: str, names: list[str]) -> dict[str, Policy]:
    mapping = getattr(module, "TENDON_TOOLS", None)
    if mapping is None:
        return {}
    if not isinstance(mapping, dict):
        raise ToolLoadError(f"TENDON_TOOLS in {spec} must be a dict of tool name to policy")
    policies: dict[str, Policy] = {}
    for name, raw in mapping.items():
        where = f"TENDON_TOOLS[{name!r}] in {spec}"
        if name not in names:
            served = ", ".join(names) or "none"
            raise ToolLoadError(f"{where}: no agent in the module has a tool {name!r} (tools: {served})")
        try:
            entry = _Entry.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            place = ".".join(map(str, first["loc"])) or "entry"
            raise ToolLoadError(f"{where}: {place}: {first['msg']}") from None
        query = entry.query
        if isinstance(query, str):
            if not callable(getattr(module, query, None)):
                raise ToolLoadError(f"{where}: query {query!r} is not a function of the module")
            query = getattr(module, query)
        policies[name] = Policy(entry.route, entry.replay, query, entry.version, entry.approval)
    return policies


def _policy(one: Listed, mapped: dict[str, Policy], spec: str) -> Policy:
    marked = [p for m in one.marks if isinstance(p := getattr(m, POLICY_ATTRIBUTE, None), Policy)]
    where = f"tool {one.name} in {spec}"
    if marked and one.name in mapped:
        raise ToolLoadError(f"{where} has a policy from both @policy and TENDON_TOOLS: keep one")
    chosen = mapped.get(one.name) or (marked[0] if marked else Policy())
    if chosen.query is not None:
        if not inspect.iscoroutinefunction(chosen.query):
            raise ToolLoadError(f"{where}: its query must be an async function")
        if chosen.replay is ReplayPolicy.SAFE:
            raise ToolLoadError(f"{where}: a query is for unsafe tools (a safe one is run again)")
    return chosen


def _tool(one: Listed, chosen: Policy, route: str, query: QueryFn | None) -> FrameworkTool:
    definition = {"name": one.name, "description": one.description, "schema": one.schema}
    binding = ToolBinding.build(
        name=one.name,
        version=chosen.version or f"{one.framework}-{digest(definition)[:12]}",
        route=route,
        description=one.description,
        input_schema=one.schema,
        replay_policy=chosen.replay,
        has_query=query is not None,
        requires_approval=one.approval if chosen.approval is None else chosen.approval,
    )
    return FrameworkTool(
        fn=partial(_run, one), binding=binding, query=query, args_model=dict,
        framework=one.framework, checker=one.validate,
    )  # fmt: skip


def framework_tools(module: ModuleType, spec: str) -> list[Tool]:
    """The tools of the agents ``module`` defines, each with its policy; ToolLoadError if a
    policy is wrong."""
    listed = _listed(module, spec)
    mapped = _mapped(module, spec, [one.name for one in listed])
    default = getattr(module, "TENDON_ROUTE", None) or DEFAULT_ROUTE
    tools: list[Tool] = []
    for one in listed:
        chosen = _policy(one, mapped, spec)
        route = chosen.route or default
        if not isinstance(route, str) or not re.fullmatch(ROUTE, route):
            raise ToolLoadError(f"tool {one.name} in {spec}: route {route!r} is not a route name")
        tools.append(_tool(one, chosen, route, chosen.query))
    return tools
