"""MCP servers as a source of tools: each tool a server lists becomes a :class:`Tool` like one
declared with ``@tool``, so the pool runs it, records it and recovers it the same way.

Binding: the server's name, description and input schema; the version is a digest of the tool's
whole listing, so a server whose tool changed announces a new binding. Replay policy: safe when
the tool is annotated ``readOnlyHint``, else unsafe (``idempotentHint`` is only noted: it is the
server's word, not a handle Tendon can check), unless the config says otherwise per tool.

Every ``tools/call`` carries the execution id as ``_meta["io.tendon/operation_id"]``, for a
server that uses it as an idempotency key. A tool whose listing declares the Tendon durable
extension, ``_meta["io.tendon/durable"] = {"query": TOOL, "cancel": TOOL}``, is recovered by
its query after a crash (called with ``{"operation_id": ID}``, it answers a structured
``{"found": true, "result": ...}`` or ``{"found": false}``) and stopped by its cancel tool
(same argument) when Tendon cancels the call.

Results keep the server's content blocks and structured content:
``{"content": [...], "structuredContent": ...}``; ``isError`` fails the call with the text of
its content (a tool error the model sees). A connection that breaks during a call raises
:class:`OutcomeUnknownError`: the replay rule decides, never a blind second call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from jsonschema import Draft202012Validator

from hands.tools.declare import Found, NotFound, OutcomeUnknownError, Park, Tool, ToolContext
from hands.tools.mcp_client import McpConnection, McpConnectionLostError, McpUnreachableError
from hands.tools.mcp_config import McpServerSpec
from infra.process.logging import get_logger
from protocol import ReplayPolicy, SchemaError, ToolBinding, codec, digest

log = get_logger(__name__)
OPERATION_META = "io.tendon/operation_id"
DURABLE_META = "io.tendon/durable"
CANCEL_WAIT = 10.0  # how long a cancelled call may take to end once the server confirmed the cancel
FOLLOW_TRIES = 10  # connections lost in a row while following a task before it is left UNKNOWN


# How the SDK says a server asked its client something in the middle of a plain call: the client
# refused it (it declares neither capability), or the server had no channel to ask on (2026-07-28).
ASKED_IN_A_PLAIN_CALL = (
    ("Elicitation not supported", "input (elicitation/create)"),
    ("Cannot send 'elicitation/", "input (elicitation/create)"),
    ("Sampling not supported", "a model's message (sampling/createMessage)"),
    ("Cannot send 'sampling/", "a model's message (sampling/createMessage)"),
)


def _task_id(handle: str | None) -> str:
    return str(codec.loads(handle or "{}").get("mcp_task", ""))


@dataclass(frozen=True)
class ParkTimes:
    """When a worker stops following a task and parks it (``Park``): at once when it waits for a
    person (looked at again every ``check`` seconds, and at once when the answer or a cancel comes),
    and after following it ``after`` seconds while it works (inf: never), looked at again after a
    second, then twice as long each time, up to ``check`` seconds."""

    after: float = 5.0
    check: float = 60.0

    def next_check(self, checks: int, poll_ms: int | None) -> float:
        return min(self.check, max(1.0, (poll_ms or 0) / 1000) * 2 ** min(checks, 16))


class McpToolError(Exception):
    """The server answered the call with ``isError``."""


class McpCancelledError(Exception):
    """The call was stopped by a Tendon cancel; the message says whether the server confirmed."""


@dataclass(frozen=True)
class McpTool(Tool):
    """A tool served by an MCP server, validated against the JSON Schema the server lists."""

    server: str = ""
    idempotent: bool = False

    def validate_args(self, args: dict[str, Any]) -> dict[str, Any]:
        errors = list(Draft202012Validator(self.binding.input_schema).iter_errors(args))
        if errors:
            detail = "; ".join(f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message}" for e in errors[:5])
            raise SchemaError(f"arguments for tool {self.name!r} are invalid: {detail}")
        return dict(args)


def _dump(model: Any) -> Any:
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


def result_of(result: Any) -> dict[str, Any]:
    """A ``CallToolResult`` as the execution's result, or McpToolError for ``isError``."""
    content = [_dump(block) for block in result.content]
    if result.is_error:
        texts = [b.get("text", "") for b in content if b.get("type") == "text"]
        raise McpToolError("; ".join(t for t in texts if t) or "the MCP server answered isError")
    out: dict[str, Any] = {"content": content}
    if result.structured_content is not None:
        out["structuredContent"] = result.structured_content
    return out


def replay_policy(listed: Any, overrides: dict[str, ReplayPolicy]) -> ReplayPolicy:
    """Safe only for a read-only tool, unless the config says otherwise."""
    if listed.name in overrides:
        return overrides[listed.name]
    annotations = listed.annotations
    return (
        ReplayPolicy.SAFE if annotations is not None and annotations.read_only_hint else ReplayPolicy.UNSAFE
    )


@dataclass
class _Questions:
    """The questions of one task this worker answered while it follows it. The same question asked
    again after the task went on from its answer is a new round, under a new key: the person is
    asked again, never answered for by the answer they gave before (a server that found it
    invalid would ask for ever)."""

    sent: set[str] = field(default_factory=set)
    rounds: dict[str, int] = field(default_factory=dict)
    moved: bool = False  # the task was seen past input_required since the last answer was sent

    checks: int = 0  # looks at a task that worked on while parked, since the last answer sent

    @classmethod
    def of(cls, handle: str | None) -> _Questions:
        """What a worker that parked the task (``state``) left in its handle. Parked only while the
        task waited for a new answer or worked on, so it has moved since any answer sent."""
        kept = codec.loads(handle or "{}")
        rounds = {str(k): int(v) for k, v in (kept.get("rounds") or {}).items()}
        return cls(set(kept.get("sent") or ()), rounds, moved=True, checks=int(kept.get("checks") or 0))

    def state(self, handle: str | None) -> str:
        """``handle`` with these questions in it, to park with."""
        kept = codec.loads(handle or "{}")
        kept |= {"sent": sorted(self.sent), "rounds": self.rounds, "checks": self.checks}
        return codec.dumps(kept).decode()

    def key(self, base: str) -> str | None:
        """The key of the question now (None: its answer was sent and the task has not moved)."""
        n = self.rounds.get(base, 0)
        key = f"{base}#{n}" if n else base
        if key not in self.sent:
            return key
        if not self.moved:
            return None
        self.rounds[base] = n + 1
        return f"{base}#{n + 1}"


class ServerCalls:
    """The calls of one server's tools, through its connection."""

    def __init__(self, connection: McpConnection, park: ParkTimes | None = None) -> None:
        self.connection = connection
        self.park = park or ParkTimes()

    async def call(self, name: str, cancel_tool: str | None, ctx: ToolContext, **args: Any) -> Any:
        if not ctx.cancelled.is_set():
            await ctx.ensure_owner()  # right before the effect: a worker presumed dead stops here
        return await self._watched(self._start(name, args, ctx), cancel_tool, ctx)

    async def reattach(self, name: str, cancel_tool: str | None, ctx: ToolContext, **args: Any) -> Any:
        """Follow the task an earlier attempt started (``ctx.handle``) to its end; never call."""
        return await self._watched(self._follow(_task_id(ctx.handle), ctx, resumed=True), cancel_tool, ctx)

    async def _start(self, name: str, args: dict[str, Any], ctx: ToolContext) -> Any:
        from mcp import MCPError

        from hands.tools.mcp_tasks import TaskCreated

        try:
            return await self.connection.call(name, args, {OPERATION_META: ctx.operation_id})
        except TaskCreated as created:
            task_id = created.task.task_id
        except MCPError as exc:
            asked = next((what for sign, what in ASKED_IN_A_PLAIN_CALL if sign in str(exc)), None)
            if asked is None:
                raise
            raise McpToolError(
                f"the MCP server asked for {asked} during a plain call of {name}, which a Tendon pool "
                "does not answer (it has no person at hand there): a server asks a person through a "
                f"task's input_required (the Tasks extension) ({exc})"
            ) from exc
        # In the ledger before the wait: from here on a crash re-attaches instead of calling again.
        handle = {"mcp_task": task_id, "server": self.connection.spec.name}
        await ctx.keep_handle(codec.dumps(handle).decode())
        log.info("mcp_task_kept", task_id=task_id, tool=name)
        return await self._follow(task_id, ctx)

    async def _follow(self, task_id: str, ctx: ToolContext, *, resumed: bool = False) -> Any:
        """Poll ``tasks/get`` until the task ends (its result, or the error it ended with), or park
        it (``Park``) while it waits for a person or works on past the poll window (none when
        ``resumed`` from a park: one look, then parked again unless it moved)."""
        from hands.tools.mcp_tasks import final_result

        losses = 0
        asked = _Questions.of(ctx.handle) if resumed else _Questions()
        clock = asyncio.get_running_loop().time
        since, window = clock(), 0.0 if resumed else self.park.after
        while True:
            try:
                state = await self.connection.task("tasks/get", task_id)
            except (McpConnectionLostError, McpUnreachableError) as exc:
                losses += 1  # asking is harmless: ask again, on a new connection
                if losses >= FOLLOW_TRIES:
                    raise OutcomeUnknownError(f"{exc} (following task {task_id}, {losses} times)") from exc
                await asyncio.sleep(0.5)
                continue
            if state.status == "completed":
                return final_result(state)
            if state.status == "failed":
                raise McpToolError(f"task {task_id} failed: {(state.error or {}).get('message', '')}")
            if state.status == "cancelled":
                raise McpCancelledError(f"task {task_id} was cancelled: {state.status_message or ''}")
            if state.status == "input_required":
                sent = len(asked.sent)
                waits = await self._input(task_id, state, ctx, asked)
                if waits is not None:
                    why = f"task {task_id} waits for a person's answer"
                    raise Park(asked.state(ctx.handle), self.park.check, awaiting=waits, why=why)
                if len(asked.sent) > sent:  # answered: it may end soon, follow it a window again
                    asked.checks, since, window = 0, clock(), self.park.after
            else:
                asked.moved = True
                if clock() - since >= window:
                    wake_in = self.park.next_check(asked.checks, state.poll_interval_ms)
                    asked.checks += 1
                    why = f"task {task_id} is {state.status}"
                    raise Park(asked.state(ctx.handle), wake_in, why=why)
            await asyncio.sleep(min(max((state.poll_interval_ms or 500) / 1000, 0.05), 5.0))

    async def _input(self, task_id: str, state: Any, ctx: ToolContext, asked: _Questions) -> str | None:
        """A task in ``input_required``: a person is asked (once per question: its key is the
        task's and a digest of its requests), and once they answered (the answer is in the
        ledger), the answer is sent with ``tasks/update``. A worker that takes the execution over
        finds the answer there and sends it again if the task still asks: each request key is
        the server's, so a repeat answers the same question. Returns the key of the question
        asked and not answered yet (the task waits for a person), else None."""
        from hands.tools.mcp_tasks import question, responses

        requests = dict(state.input_requests or {})
        key = asked.key(f"{task_id}/{digest(requests)[:16]}")
        if key is None:
            return None  # answered: the server has not taken the answer yet
        given = await ctx.given_input(key)
        if given is None:
            await ctx.ask_input(key, question(state), requests)
            return key
        await self.connection.task("tasks/update", task_id, responses(requests, given))
        asked.sent.add(key)
        asked.moved = False
        log.info("mcp_task_input_sent", task_id=task_id, key=key, decision=given.get("decision"))
        return None

    async def _watched(
        self, work: Coroutine[Any, Any, Any], cancel_tool: str | None, ctx: ToolContext
    ) -> Any:
        """Run ``work`` (the call, or following its task) until it ends or a cancel is asked."""
        call = asyncio.create_task(work)
        asked = asyncio.create_task(ctx.cancelled.wait())
        try:
            await asyncio.wait([call, asked], return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            # The body itself is being cancelled (a drain out of grace, a worker presumed dead):
            # its call must not go on behind it.
            call.cancel()
            raise
        finally:
            asked.cancel()
        if not call.done():
            said = await self._stop(call, cancel_tool, ctx)
            if not call.cancelled() and call.exception() is None and not call.result().is_error:
                return result_of(call.result())  # it ended with its result before the cancel took
            raise McpCancelledError(said)
        try:
            return result_of(call.result())
        except McpConnectionLostError as exc:
            raise OutcomeUnknownError(str(exc)) from exc

    async def _stop(self, call: asyncio.Task[Any], cancel_tool: str | None, ctx: ToolContext) -> str:
        """Stop a call in flight: its task by ``tasks/cancel``, else by the tool's cancel tool (the
        call's own answer then ends it), else by cancelling the request (``notifications/
        cancelled``, which a server may ignore). Returns what the server said."""
        how: str | None = None
        if ctx.handle is not None:
            how, stop = "tasks/cancel", partial(self.connection.task, "tasks/cancel", _task_id(ctx.handle))
        elif cancel_tool is not None:
            how, stop = (
                cancel_tool,
                partial(self.connection.call, cancel_tool, {"operation_id": ctx.operation_id}, {}),
            )
        said = "the server has no cancel tool; the request was cancelled (notifications/cancelled)"
        if how is not None:
            try:
                confirmed = not getattr(await stop(), "is_error", False)
                said = f"the server {'confirmed' if confirmed else 'refused'} the cancel ({how})"
            except Exception as exc:  # noqa: BLE001 - said in the outcome
                confirmed = False
                said = f"the cancel ({how}) failed: {type(exc).__name__}: {exc}"
            if confirmed:
                await asyncio.wait([call], timeout=CANCEL_WAIT)
                if call.done():
                    return said
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        return said

    async def query(self, query_tool: str, ctx: ToolContext, **_: Any) -> Found | NotFound:
        answer = await self.connection.call(query_tool, {"operation_id": ctx.operation_id}, {})
        if answer.is_error:
            raise McpToolError(f"query tool {query_tool} answered isError")
        found = (answer.structured_content or {}).get("found")
        if found is True:
            result = answer.structured_content.get("result")
            return Found({"content": [], "structuredContent": result})
        if found is False:
            return NotFound()
        raise McpToolError(f"query tool {query_tool} answered without a structured found: true or false")


def bind_tool(route: str, spec: McpServerSpec, calls: ServerCalls, listed: Any, names: set[str]) -> McpTool:
    listing = _dump(listed)
    durable = (listed.meta or {}).get(DURABLE_META) or {}
    query = durable.get("query") if durable.get("query") in names else None
    cancel = durable.get("cancel") if durable.get("cancel") in names else None
    annotations = listed.annotations
    binding = ToolBinding.build(
        name=listed.name,
        version=f"mcp-{digest(listing)[:12]}",
        route=route,
        description=listed.description or listed.title or "",
        input_schema=listed.input_schema,
        replay_policy=replay_policy(listed, spec.replay),
        has_query=query is not None,
    )
    return McpTool(
        fn=partial(calls.call, listed.name, cancel),
        binding=binding,
        query=partial(calls.query, query) if query else None,
        reattach=partial(calls.reattach, listed.name, cancel),
        args_model=dict,
        server=spec.name,
        idempotent=bool(annotations is not None and annotations.idempotent_hint),
    )
