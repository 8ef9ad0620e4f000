"""Declaring tools: a decorator that turns a typed async function into a served tool.

    @tool(route="email", version="1", replay="unsafe", query=find_sent_email)
    async def send_email(ctx: ToolContext, to: str, subject: str) -> dict: ...

The JSON Schema of the arguments comes from the type hints (through pydantic), and the
binding digest pins name, version, route, schema and replay policy.

A tool of an agent framework (Pydantic AI, the OpenAI Agents SDK) keeps the framework's own
decorator and gets its route and replay policy from :func:`policy` (or the module's
``TENDON_TOOLS`` mapping; ``hands.tools.frameworks``); its body reads the execution's context
with :func:`current_context`.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, get_type_hints

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


class Park(Exception):  # noqa: N818 - not an error: how a body hands its wait to the ledger
    """A body that follows an operation by the handle it kept (``ctx.keep_handle``) raises it to
    stop following it for now, when waiting would only hold a worker's slot (the operation waits
    for a person, or runs long). The pool parks the execution: the row keeps ``handle`` (the state
    to go on from) and no worker holds it, nothing polls, until ``wake_in`` seconds have passed, or
    the answer to question ``awaiting`` (``ctx.ask_input``) or a cancel comes; then any worker of the
    pool re-attaches (the tool's ``reattach``, with this ``handle``)."""

    def __init__(self, handle: str, wake_in: float, awaiting: str | None = None, why: str = "") -> None:
        super().__init__(why or f"parked for {wake_in:g} s")
        self.handle = handle
        self.wake_in = wake_in
        self.awaiting = awaiting
        self.why = why


class _NullOutput:
    async def write(self, data: str) -> None:  # pragma: no cover - trivial
        return None


async def _always_owner() -> None:  # a context made outside a worker (tests of a tool)
    return None


async def _keep_nowhere(handle: str) -> None:  # a context made outside a worker
    return None


async def _ask_nobody(key: str, message: str, requests: dict[str, Any]) -> None:
    raise RuntimeError("this context has no one to ask (it was made outside a worker)")


async def _no_answer(key: str) -> dict[str, Any] | None:
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

    asker: Callable[[str, str, dict[str, Any]], Awaitable[None]] = _ask_nobody
    answers: Callable[[str], Awaitable[dict[str, Any] | None]] = _no_answer

    async def ask_input(self, key: str, message: str, requests: dict[str, Any]) -> None:
        """Ask a person for input (the turn shows it as a pending interaction, answered with
        `brain respond TURN CALL --result JSON` or ``--deny``): committed to the ledger as an
        ``input_required`` event, once per ``key`` (asking again under a key asked before is a
        no-op, so a worker that took the execution over may ask freely)."""
        await self.asker(key, message, requests)

    async def given_input(self, key: str) -> dict[str, Any] | None:
        """The answer to question ``key`` once a person gave it (from the ledger, so one given
        while no worker ran the execution is here too): ``{"decision": "answer", "answer": ...}``
        or ``{"decision": "decline", "reason": ...}``; None until then."""
        return await self.answers(key)

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


POLICY_ATTRIBUTE = "__tendon_policy__"
Marked = TypeVar("Marked")


@dataclass(frozen=True)
class Policy:
    """How Tendon serves one framework tool: its route, replay policy, query, version, approval.
    ``None`` leaves a field to the defaults (``hands.tools.frameworks``)."""

    route: str | None = None
    replay: ReplayPolicy = ReplayPolicy.UNSAFE
    query: QueryFn | None = None
    version: str | None = None
    approval: bool | None = None


def policy(
    *,
    route: str | None = None,
    replay: str | ReplayPolicy = "unsafe",
    query: QueryFn | None = None,
    version: str | None = None,
    approval: bool | None = None,
) -> Callable[[Marked], Marked]:
    """Give a Pydantic AI or OpenAI Agents SDK tool its Tendon route and replay policy; the
    framework's own decorator stays, on either side of this one::

        @agent.tool_plain
        @policy(route="email", replay="unsafe", query=find_sent_email)
        async def send_email(to: str, subject: str, body: str) -> dict: ...

    ``query`` is an async ``(ctx: ToolContext, **args) -> Found | NotFound`` called with the
    model's arguments after a crash inside the body; the body reads the operation id with
    :func:`current_context`. It returns what it decorates, marked."""
    if replay not in ("safe", "unsafe"):  # at import, with what to write instead
        raise ValueError(f"policy(replay={replay!r}): replay is 'safe' or 'unsafe'")
    chosen = Policy(route=route, replay=ReplayPolicy(replay), query=query, version=version, approval=approval)

    def mark(target: Marked) -> Marked:
        setattr(target, POLICY_ATTRIBUTE, chosen)
        return target

    return mark


_CURRENT: contextvars.ContextVar[ToolContext] = contextvars.ContextVar("tendon_tool_context")


def current_context() -> ToolContext:
    """The context of the execution this code runs in (its ``operation_id``, ``output``,
    ``ensure_owner``...): how a framework tool, which gets no ``ctx`` from Tendon, reaches it."""
    try:
        return _CURRENT.get()
    except LookupError:
        raise RuntimeError("current_context() is only available inside a tool run by a Hands pool") from None


def context_for(ctx: ToolContext) -> contextvars.Context:
    """A copy of this context in which :func:`current_context` answers ``ctx``: a task started in it
    (and the threads that task starts) sees it, the caller does not."""
    copied = contextvars.copy_context()
    copied.run(_CURRENT.set, ctx)
    return copied
