"""Running accepted executions: start, body, output, outcome; and recovering orphans.

The tool body and its query run *outside* any transaction (a ten-minute tool never holds one);
every state change is saved by ``hands.run.outcomes`` (one fenced commit each, its events handed to
the relay).

Kill points on this path (armed with ``TENDON_KILL_AT``, tag = the tool call id):
``hands.before_tool_body`` and ``hands.after_tool_body`` (the body returned, so the external
system may have acted, but nothing about it is saved yet).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Literal

from pydantic_core import to_jsonable_python
from structlog.contextvars import bound_contextvars

from hands.rules.replay import Recovery, decide
from hands.rules.states import OPEN_STATUSES, LedgerStatus
from hands.run.outcomes import Outcomes
from hands.run.tasks import Tasks
from hands.run.writer import LedgerWriter
from hands.store import Change, Execution
from hands.tools.declare import Found, NotFound, OutcomeUnknownError, Park, Tool, ToolContext
from hands.tools.registry import ToolRegistry
from infra.process.killpoints import KillPoints
from infra.process.logging import get_logger
from infra.process.tracing import Tracing
from protocol import CancelledBody, StartedBody, codec
from protocol.storable import describe

log = get_logger(__name__)
LOST_CALL_RERUNS = 3  # a safe call whose outcome was lost this many times fails instead
StartReason = Literal["first_run", "rerun_after_crash"]


class BadResultError(ValueError):
    """A tool (or query) returned something that is not JSON."""


def _jsonable(value: Any) -> Any:
    """The value as plain JSON data, or BadResultError saying why it is not."""
    try:
        plain = to_jsonable_python(value)
        codec.dumps(plain)
    except (TypeError, ValueError) as exc:
        raise BadResultError(f"{type(value).__name__} is not JSON: {exc}") from exc
    return plain


class LedgerOutput:
    """A tool's output writer: every write is one committed page with its byte offset."""

    def __init__(self, outcomes: Outcomes, execution_id: str) -> None:
        self._outcomes = outcomes
        self._execution_id = execution_id

    async def write(self, data: str) -> None:
        if data:
            await self._outcomes.page(self._execution_id, data)


class Executor:
    """Runs the bodies of this worker's executions, and the replay rule on recovered ones: its
    ``tasks`` keep the bookkeeping, its ``outcomes`` save every change."""

    def __init__(
        self,
        *,
        tasks: Tasks,
        outcomes: Outcomes,
        writer: LedgerWriter,
        registry: ToolRegistry,
        kill: KillPoints,
        tracing: Tracing | None = None,
        confirm_owner: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.tasks = tasks
        self.outcomes = outcomes
        self._writer = writer
        self._registry = registry
        self._kill = kill
        self._tracing = tracing or Tracing(None)
        # Half of a tool's ``ctx.ensure_owner()``: this worker's liveness, which after a freeze
        # waits for the keeper's next look (the ledger's word is the other half: ``_still_owner``).
        self._confirm_owner = confirm_owner

    def launch(self, execution_id: str, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work`` as this (reserved) execution's task (``Tasks.launch``), its failures
        settled (``Outcomes.settled``)."""
        self.tasks.launch(execution_id, partial(self.outcomes.settled, execution_id, work))

    # ---- running -----------------------------------------------------------------------

    async def run(
        self, execution_id: str, reason: StartReason = "first_run", row: Execution | None = None,
        trace: str | None = None, args: dict[str, Any] | None = None,
        after: Awaitable[bool] | None = None,
    ) -> None:  # fmt: skip
        """Start (or re-start) the body of an execution this worker owns and save its outcome.
        ``row``: the ledger row as the caller just committed it (RUNNING already: a safe tool
        accepted and started in one commit). ``trace``: the span of the Brain's that asked for it
        (a re-run after a crash starts a trace of its own). ``args``: the row's arguments as the
        tool validated them when the command was accepted (else they are validated here).
        ``after``: for a command just accepted, the controls that waited when it came, handled
        (``ControlsFirst.caught_up``): if there were any, one may have been its cancel, handled
        here or by another worker, so the row is read again for the flag it would have set."""
        if after is not None and await after:
            row = None
        row = row or await self.outcomes.row(execution_id)
        self.outcomes.remember(row)
        with bound_contextvars(execution_id=execution_id, turn_id=row.turn_id, tool=row.tool):
            tool = self._registry.served(row.tool, row.binding_digest)
            if tool is None:
                # Only reachable from ACCEPTED (the replay rule never re-runs an unserved tool),
                # so nothing ran: rejecting is safe.
                error = {
                    "code": "routing_error",
                    "message": f"tool {row.tool} with binding digest {row.binding_digest} "
                    f"is no longer served by route {row.route}",
                }
                await self.outcomes.fail(execution_id, error, how="rejected")
                return
            if row.status is LedgerStatus.RUNNING and reason == "first_run":
                attempt: int | None = row.attempts
                # A cancel came between the commit and now (here, or recorded by any worker).
                if self.tasks.cancel_asked(execution_id) or row.cancel_requested:
                    before = CancelledBody(reason="cancel requested before the tool started")
                    await self.outcomes.finish(execution_id, LedgerStatus.CANCELLED, before)
                    return
            else:
                attempt = await self._start(execution_id, reason, cancel_asked=row.cancel_requested)
            if attempt is None:
                log.info("execution_cancelled_before_start")
                return
            attributes = {
                "tendon.turn_id": row.turn_id,
                "tendon.execution_id": execution_id,
                "tendon.attempt": attempt,
            }
            with self._tracing.span(f"execute {row.tool}", attributes, traceparent=trace):
                await self._body(row, tool, attempt, args)

    async def _start(self, execution_id: str, reason: StartReason, *, cancel_asked: bool) -> int | None:
        """Start the body (the attempt's number), or, if a cancel was asked for (here, in the row
        this worker knows, or in the row as committed by any worker), end it CANCELLED instead
        (None): a cancel that comes before the body means the body never runs."""
        attempt: int | None = 0

        async def start(row: Execution) -> Change:
            nonlocal attempt
            if cancel_asked or row.cancel_requested or self.tasks.cancel_asked(execution_id):
                attempt = None
                body: Any = CancelledBody(reason="cancel requested before the tool started")
                events = await self._writer.events(execution_id, row.header, row.last_seq + 1, body)
                return Change(row, LedgerStatus.CANCELLED, events)
            attempt = row.attempts + 1
            body = StartedBody(attempt=attempt, worker=self.tasks.worker_id, reason=reason)
            events = await self._writer.events(execution_id, row.header, row.last_seq + 1, body)
            return Change(row, LedgerStatus.RUNNING, events, attempts=attempt, unless_cancelled=True)

        def landed(row: Execution) -> bool:
            # Only the owner counts attempts or closes a row, so this is the earlier attempt's.
            if attempt is None:
                return row.status is LedgerStatus.CANCELLED
            return row.status is LedgerStatus.RUNNING and row.attempts == attempt

        await self.outcomes.save(execution_id, start, landed=landed)
        if attempt is not None:
            log.info("execution_started", attempt=attempt, reason=reason)
        return attempt

    def _context(self, row: Execution, attempt: int, *, output: bool) -> ToolContext:
        execution_id = row.execution_id
        cancelled = self.tasks.cancel_signal(execution_id)
        ctx = ToolContext(
            operation_id=execution_id, attempt=attempt, cancelled=cancelled, handle=row.handle,
            namespace=row.namespace, session_id=row.session_id, output_offset=row.output_bytes,
        )  # fmt: skip
        ctx.owner_check = partial(self._still_owner, execution_id)
        ctx.handle_keeper = partial(self.outcomes.keep_handle, execution_id)
        ctx.asker = partial(self.outcomes.ask, execution_id)
        ctx.answers = partial(self.outcomes.answer, execution_id)
        if output:
            ctx.output = LedgerOutput(self.outcomes, execution_id)
        return ctx

    async def _still_owner(self, execution_id: str) -> None:
        """``ctx.ensure_owner()``: the lease this worker's liveness last renewed says nothing of
        a judgement that presumed it dead another way (a lost session not taken again within the
        grace), so the ledger has the last word: the row is still this worker's and open."""
        if self._confirm_owner is not None:
            await self._confirm_owner()
        await self.outcomes.confirm_owner(execution_id)

    async def _body(
        self, row: Execution, tool: Tool, attempt: int, args: dict[str, Any] | None = None,
        *, reattach: bool = False,
    ) -> None:  # fmt: skip
        """Run the tool's body (or, with ``reattach``, follow the operation its handle names)."""
        execution_id = row.execution_id
        self._kill.hit("hands.before_tool_body", row.call_id)
        ctx = self._context(row, attempt, output=True)
        body = tool.reattach if reattach and tool.reattach is not None else tool.fn
        try:
            if args is None:  # following calls nothing: the arguments the call was made with
                args = dict(row.args or {}) if reattach else tool.validate_args(row.args or {})
            result = _jsonable(await body(ctx, **args))
        except Park as park:
            if tool.reattach is None:  # nothing could take it up again: a bug of the tool's
                await self._tool_stopped(row, ctx, TypeError(f"tool {tool.name} parks but cannot re-attach"))
                return
            # Its slot is free once this task ends; the row holds what it waits for.
            await self.outcomes.park(execution_id, park.handle, park.wake_in, park.awaiting)
            log.info("execution_parked", wake_in=park.wake_in, awaiting=park.awaiting, why=park.why)
            return
        except OutcomeUnknownError as exc:
            if ctx.cancelled.is_set():
                await self._tool_stopped(row, ctx, exc)
            else:
                await self._lost(row, tool, attempt, exc)
            return
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this task is being cancelled (shutdown out of grace): not an outcome
            # The tool itself gave up with CancelledError, typically honouring ctx.cancelled.
            await self._tool_stopped(row, ctx, exc)
            return
        except Exception as exc:
            await self._tool_stopped(row, ctx, exc)
            return
        self._kill.hit("hands.after_tool_body", row.call_id)
        await self.outcomes.succeed(execution_id, result)

    async def _lost(self, row: Execution, tool: Tool, attempt: int, exc: OutcomeUnknownError) -> None:
        """The body could not tell whether its effect happened (a remote call whose connection
        broke): the replay rule decides as after a crash, and this worker acts on it at once."""
        self._kill.hit("hands.after_tool_body", row.call_id)
        execution_id = row.execution_id
        handle = (await self.outcomes.row(execution_id)).handle
        if handle is not None and tool.reattach is not None:
            # The body followed an operation by its handle and lost sight of it: it may still run.
            reason = f"{describe(exc)}; the operation it follows ({handle}) was not seen to end"
            await self.outcomes.mark_unknown(execution_id, reason)
            return
        decision = decide(
            LedgerStatus.RUNNING, row.replay_policy or "unsafe", tool.binding.replay_policy,
            tool.query is not None, tool=tool.name,
        )  # fmt: skip
        log.warning("tool_outcome_lost", error=describe(exc), action=decision.action.value)
        if decision.action is Recovery.RERUN:
            if attempt < LOST_CALL_RERUNS:
                await self.run(execution_id, "rerun_after_crash")
            else:
                error = f"{describe(exc)} (attempt {attempt} of safe tool {tool.name}; not tried again)"
                await self.outcomes.fail(execution_id, {"code": "tool_error", "message": error})
        elif decision.action is Recovery.QUERY:
            await self.query(row, tool)
        else:
            reason = f"{describe(exc)}; unsafe tool {tool.name} has no query, so it is not called again"
            await self.outcomes.mark_unknown(execution_id, reason)

    async def _tool_stopped(self, row: Execution, ctx: ToolContext, exc: BaseException) -> None:
        """Save the outcome of a body that raised: CANCELLED if a cancel was asked, else FAILED."""
        execution_id = row.execution_id
        self._kill.hit("hands.after_tool_body", row.call_id)
        if ctx.cancelled.is_set():
            reason = f"cancel requested; the tool stopped with {describe(exc)}"
            await self.outcomes.finish(execution_id, LedgerStatus.CANCELLED, CancelledBody(reason=reason))
            return
        if isinstance(exc, asyncio.CancelledError):
            await self.outcomes.fail(
                execution_id, {"code": "tool_error", "message": "CancelledError: the tool cancelled itself"}
            )
            return
        code = "bad_result" if isinstance(exc, BadResultError) else "tool_error"
        log.info("tool_raised", error=describe(exc))
        await self.outcomes.fail(execution_id, {"code": code, "message": describe(exc)})

    # ---- recovery ----------------------------------------------------------------------

    async def adopt(self, execution_id: str) -> None:
        """Recover an open execution this worker owns but has no task for (an unclear commit that
        landed, or a release that failed): nothing here knows how far the body got, so it is
        treated like an orphan and the replay rule decides."""
        row = await self.outcomes.row(execution_id)
        if row.owner != self.tasks.worker_id or row.status not in OPEN_STATUSES:
            return  # closed or released meanwhile
        log.warning("execution_adopted", execution_id=execution_id, status=row.status.value)
        await self.recover(row)

    async def recover(self, row: Execution) -> None:
        """Apply the replay rule to an execution claimed from a dead owner (or adopted)."""
        with bound_contextvars(execution_id=row.execution_id, turn_id=row.turn_id, tool=row.tool):
            # Its owner may have died between a commit and its publish: what it committed goes
            # out again first (the Brain drops the seqs it has), so the Brain need not wait for
            # a gap or a stall to ask for it. Output pages are left to the Brain's gap replay.
            self._writer.sent(row.events)
            served = self._registry.served(row.tool, row.binding_digest)
            # A handle is followed by the tool as frozen, else by its newest version served:
            # following never calls it (its listing may have changed while it was parked).
            follower = served or self._registry.get(row.tool)
            decision = decide(
                row.status,
                row.replay_policy or "unsafe",
                served.binding.replay_policy if served else None,
                bool(served and served.query),
                tool=row.tool or "an unknown tool",
                has_handle=bool(row.handle and follower and follower.reattach),
            )
            log.info("recovering", action=decision.action.value, reason=decision.reason)
            if decision.action is Recovery.START:
                await self.run(row.execution_id, "first_run", row=row)
            elif decision.action is Recovery.RERUN:
                await self.run(row.execution_id, "rerun_after_crash", row=row)
            elif decision.action is Recovery.REATTACH:
                assert follower is not None
                if row.cancel_requested:  # asked while it was parked (or its owner died)
                    self.tasks.cancel_local(row.execution_id)
                await self._body(row, follower, max(row.attempts, 1), reattach=True)
            elif decision.action is Recovery.QUERY:
                assert served is not None
                await self.query(row, served)
            else:
                await self.outcomes.mark_unknown(row.execution_id, decision.reason)

    async def query(self, row: Execution, tool: Tool) -> None:
        """Ask the tool's query about the original operation; never re-run blindly."""
        execution_id = row.execution_id

        async def to_querying(current: Execution) -> Change:
            return Change(current, LedgerStatus.QUERYING, [])

        # No event: the Brain still sees "started". QUERYING -> QUERYING is allowed, so a repeat
        # after an unclear commit is harmless.
        await self.outcomes.save(execution_id, to_querying)
        assert tool.query is not None
        ctx = self._context(row, max(row.attempts, 1), output=False)
        try:
            args = tool.validate_args(row.args or {})
            answer = await tool.query(ctx, **args)
            if isinstance(answer, Found):
                result = _jsonable(answer.result)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self.outcomes.mark_unknown(
                execution_id,
                f"worker died inside the body of unsafe tool {tool.name} and its query could "
                f"not tell whether operation {execution_id} happened: {describe(exc)}",
            )
            return
        if isinstance(answer, Found):
            log.info("query_found")
            await self.outcomes.succeed(execution_id, result, how="verified_by_query")
        elif isinstance(answer, NotFound):
            # The external system never saw the operation: running it now is its first effect.
            log.info("query_not_found")
            await self.run(execution_id, "rerun_after_crash")
        else:
            await self.outcomes.mark_unknown(
                execution_id,
                f"the query of {tool.name} returned {type(answer).__name__}, expected Found or NotFound",
            )
