"""Declaring tools: a decorator that turns a typed async function into a served tool.

    @tool(route="email", version="1", replay="unsafe", query=find_sent_email)
    async def send_email(ctx: ToolContext, to: str, subject: str) -> dict: ...

The JSON Schema of the arguments comes from the type hints (through pydantic), and the
binding digest pins name, version, route, schema and replay policy.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, get_type_hints

from pydantic import ConfigDict, ValidationError, create_model

from protocol import ReplayPolicy, SchemaError, ToolBinding


class OutputWriter(Protocol):
    """Where a tool writes its incremental output; each write becomes a sealed page."""

    async def write(self, data: str) -> None: ...


@dataclass(frozen=True)
class Found:
    """A query's answer: the original operation happened and this is its result."""

    result: Any


@dataclass(frozen=True)
class NotFound:
    """A query's answer: the external system never saw the original operation."""


class OutcomeUnknownError(Exception):
    """A body raises it when it cannot tell whether its side effect happened (a connection that
    broke while a remote call was in flight): the pool then does what it does after a crash in
    the body (``hands.rules.replay``): a safe tool runs again, an unsafe one is asked by its
    query or becomes UNKNOWN, never called again blindly."""


class _NullOutput:
    async def write(self, data: str) -> None:  # pragma: no cover - trivial
        return None


async def _always_owner() -> None:  # a context made outside a worker (tests of a tool)
    return None


async def _keep_nowhere(handle: str) -> None:  # a context made outside a worker
    return None


@dataclass
class ToolContext:
    """What a running tool gets besides its arguments."""

    operation_id: str
    attempt: int = 1
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    output: OutputWriter = field(default_factory=_NullOutput)
    owner_check: Callable[[], Awaitable[None]] = _always_owner
    handle: str | None = None  # the handle an earlier attempt kept, when re-attaching
    handle_keeper: Callable[[str], Awaitable[None]] = _keep_nowhere
    # Who asked (a sandbox tool finds the session's workspace by them), and how many bytes of
    # output earlier attempts paged already (a re-attached body goes on from there).
    namespace: str = ""
    session_id: str = ""
    output_offset: int = 0

    async def keep_handle(self, handle: str) -> None:
        """Commit ``handle`` (text, e.g. JSON naming a remote task) to the ledger before waiting on
        the operation it names: if this worker dies, the tool's ``reattach`` gets it back as
        ``ctx.handle`` on another worker, which follows the operation instead of starting it
        again. Raises ``StaleOwnerError`` if this worker no longer holds the execution."""
        await self.handle_keeper(handle)
        self.handle = handle

    async def ensure_owner(self) -> None:
        """Call it right before a side effect that must not happen twice. It returns only while
        the pool's ledger says this worker still holds the execution (its row's owner, still
        open: one read), and raises ``StaleOwnerError`` once it does not: a worker frozen (a VM
        pause, SIGSTOP) or cut off from the database may wake after the others presumed it dead
        and handed the execution over, however they judged it, and would otherwise go on with
        the call it was about to make. What it cannot stop is a freeze between its return and
        the call: the operation id as the external system's idempotency key covers that."""
        await self.owner_check()


ToolFn = Callable[..., Awaitable[Any]]
QueryFn = Callable[..., Awaitable[Found | NotFound]]


@dataclass(frozen=True)
class Tool:
    """A declared tool: its function, optional query, and frozen binding. ``reattach`` (same
    parameters as ``fn``) follows an operation an earlier attempt started and named by
    ``ctx.keep_handle``, to its result: recovery calls it instead of the replay rule."""

    fn: ToolFn
    binding: ToolBinding
    query: QueryFn | None
    args_model: type
    reattach: ToolFn | None = None

    @property
    def name(self) -> str:
        return self.binding.name

    def validate_args(self, args: dict[str, Any]) -> dict[str, Any]:
        """Check arguments against the schema; raises ``SchemaError`` with a readable reason."""
        try:
            model = self.args_model.model_validate(args)  # type: ignore[attr-defined]
        except ValidationError as exc:
            detail = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors()[:5]
            )
            raise SchemaError(f"arguments for tool {self.name!r} are invalid: {detail}") from exc
        return {name: getattr(model, name) for name in type(model).model_fields}


def _args_model(fn: ToolFn) -> type:
    hints = get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].name != "ctx":
        raise TypeError(f"tool {fn.__name__} must take `ctx: ToolContext` as its first parameter")
    fields: dict[str, Any] = {}
    for p in params[1:]:
        if p.name not in hints:
            raise TypeError(f"tool {fn.__name__}: parameter {p.name!r} needs a type hint")
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[p.name] = (hints[p.name], default)
    return create_model(  # type: ignore[call-overload,no-any-return]
        f"{fn.__name__}_args", __config__=ConfigDict(extra="forbid"), **fields
    )


def tool(
    *,
    route: str,
    version: str,
    replay: str | ReplayPolicy,
    query: QueryFn | None = None,
    name: str | None = None,
    approval: bool = False,
) -> Callable[[ToolFn], Tool]:
    """Declare an async function as a tool served by the Hands pool of ``route``.

    ``replay="safe"`` lets Tendon run it again after a crash inside its body; ``"unsafe"``
    never does: its ``query`` (same parameters, returns ``Found``/``NotFound``) asks the
    external system about the original operation, and without one the execution becomes
    UNKNOWN until reconciled. ``approval=True``: every call waits for a person to approve it
    (`brain respond TURN CALL --approve`) before it is sent to the pool.
    """

    def wrap(fn: ToolFn) -> Tool:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"tool {fn.__name__} must be an async function")
        model = _args_model(fn)
        schema = model.model_json_schema()  # type: ignore[attr-defined]
        binding = ToolBinding.build(
            name=name or fn.__name__,
            version=version,
            route=route,
            description=inspect.getdoc(fn) or "",
            input_schema=schema,
            replay_policy=ReplayPolicy(replay),
            has_query=query is not None,
            requires_approval=approval,
        )
        return Tool(fn=fn, binding=binding, query=query, args_model=model)

    return wrap
