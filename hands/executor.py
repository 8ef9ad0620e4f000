"""Running accepted executions: start, body, output, outcome; and recovering orphans.

Every state change is one ledger transaction that also appends its event (invariant 2); the
tool body and its query run *outside* any transaction (a ten-minute tool never holds one).
Every commit checks that this worker still owns the row (fencing, invariant 10), and after
every commit the relay is woken to publish the new events.

Kill points on this path (armed with ``TENDON_KILL_AT``, tag = the tool call id):
``hands.before_tool_body`` and ``hands.after_tool_body`` (the body returned, so the
external system may have acted, but nothing about it is saved yet).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

import asyncpg
from pydantic_core import to_jsonable_python
from structlog.contextvars import bound_contextvars
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

from hands import ledger
from hands.ledger import Execution
from hands.registry import ToolRegistry
from hands.relay import EventRelay
from hands.replay import Recovery, decide
from hands.states import LedgerStatus
from hands.tools import Found, NotFound, Tool, ToolContext
from infra.db import transact
from infra.killpoints import KillPoints
from infra.logging import get_logger
from infra.payloads import PayloadCodec
from protocol import (
    CancelledBody,
    FailedBody,
    OutputPageBody,
    StaleOwnerError,
    StartedBody,
    SucceededBody,
    TendonError,
    UnknownBody,
    codec,
    is_retryable,
)

log = get_logger(__name__)
T = TypeVar("T")
StartReason = Literal["first_run", "rerun_after_crash"]
SuccessHow = Literal["ran", "verified_by_query", "reconciled"]
FailureHow = Literal["ran", "rejected", "verified_by_query", "reconciled"]
# How long the outcome of a body that already ran waits out a passing object-store fault.
SAVE_PATIENCE = 30.0


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


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class LedgerOutput:
    """A tool's output writer: every write is one committed page with its byte offset."""

    def __init__(self, executor: Executor, execution_id: str) -> None:
        self._executor = executor
        self._execution_id = execution_id

    async def write(self, data: str) -> None:
        if not data:
            return
        ex = self._executor

        async def work(conn: asyncpg.Connection) -> None:
            await ledger.lock_owned(conn, self._execution_id, ex.worker_id)
            offset = await ledger.add_output(conn, self._execution_id, data)
            await ledger.append_event(
                conn, ex.codec, self._execution_id, OutputPageBody(offset=offset, data=data)
            )

        await ex.commit(self._execution_id, work)


class Executor:
    """Runs this worker's executions as tasks, at most ``concurrency`` at once.

    A caller takes a slot (``await slots.acquire()``) before it commits to new work and
    hands the slot over with :meth:`launch`; the task gives it back when it ends.
    """

    def __init__(
        self,
        *,
        pool: asyncpg.Pool,
        codec: PayloadCodec,
        registry: ToolRegistry,
        worker_id: str,
        relay: EventRelay,
        kill: KillPoints,
        concurrency: int,
    ) -> None:
        self.pool = pool
        self.codec = codec
        self.registry = registry
        self.worker_id = worker_id
        self.relay = relay
        self.kill = kill
        self.concurrency = concurrency
        self.slots = asyncio.Semaphore(concurrency)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cancelled: dict[str, asyncio.Event] = {}

    # ---- plumbing -----------------------------------------------------------------------

    async def commit(self, execution_id: str, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """One ledger transaction for ``execution_id``, then wake the relay."""
        result = await transact(self.pool, work)
        self.relay.wake(execution_id)
        return result

    def launch(self, execution_id: str, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work`` as this execution's task; the caller's slot is released when it ends."""
        task = asyncio.create_task(self._guard(execution_id, work), name=f"execution-{execution_id}")
        self._tasks[execution_id] = task

    async def _guard(self, execution_id: str, work: Callable[[], Awaitable[None]]) -> None:
        try:
            await work()
        except asyncio.CancelledError:
            # Shutdown ran out of grace: the row stays open and, once this process is gone,
            # the replay rule decides what happens to it.
            log.warning("execution_interrupted", execution_id=execution_id)
            raise
        except StaleOwnerError as exc:
            log.warning("execution_fenced", execution_id=execution_id, reason=exc.message)
        except Exception as exc:
            log.exception("execution_crashed", execution_id=execution_id)
            if is_retryable(exc):
                await self._release(execution_id)
        finally:
            self._tasks.pop(execution_id, None)
            self._cancelled.pop(execution_id, None)
            self.slots.release()

    async def _release(self, execution_id: str) -> None:
        """Give up ownership of an execution this worker could not finish (services down).

        The row is handed to a released-owner name that no live worker has, so the recovery
        scan (of any worker, this one included) applies the replay rule to it, exactly as if
        this process had died; nothing waits in this process's memory.
        """
        try:
            async with self.pool.acquire() as conn:
                await ledger.release(conn, execution_id, self.worker_id)
            log.warning("execution_released", execution_id=execution_id)
        except Exception:
            log.exception("execution_release_failed", execution_id=execution_id)

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def cancel_local(self, execution_id: str) -> bool:
        """Signal a running local execution's ``ctx.cancelled``; False if it is not here."""
        event = self._cancelled.get(execution_id)
        if event is None:
            return False
        event.set()
        return True

    async def drain(self, grace: float) -> None:
        """Let running executions finish for up to ``grace`` seconds, then cancel the rest."""
        tasks = list(self._tasks.values())
        if not tasks:
            return
        log.info("draining", executions=len(tasks), grace=grace)
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def _row(self, execution_id: str) -> Execution:
        async with self.pool.acquire() as conn:
            row = await ledger.get_execution(conn, execution_id)
        assert row is not None, f"execution {execution_id} vanished from the ledger"
        return row

    # ---- outcomes -----------------------------------------------------------------------

    async def _finish(self, execution_id: str, status: LedgerStatus, body: Any, **changes: Any) -> None:
        """Move to a final (or UNKNOWN) status and append its event, in one transaction."""

        async def work(conn: asyncpg.Connection) -> None:
            row = await ledger.lock_owned(conn, execution_id, self.worker_id)
            # The output is sealed: every page was committed before this, so output_bytes
            # in the terminal event is the final length (invariant 8).
            final = body
            if isinstance(body, (SucceededBody, FailedBody)):
                final = body.model_copy(update={"output_bytes": row.output_bytes})
            await ledger.move(conn, row, status, **changes)
            await ledger.append_event(conn, self.codec, execution_id, final)

        # The body already ran: giving up here costs a re-run or an UNKNOWN, so a passing
        # object-store fault (PostgreSQL faults are retried inside transact) is waited out.
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(lambda e: isinstance(e, TendonError) and e.retryable),
            stop=stop_after_delay(SAVE_PATIENCE),
            wait=wait_exponential_jitter(initial=0.2, max=5.0),
            reraise=True,
        ):
            with attempt:
                await self.commit(execution_id, work)
        log.info("execution_" + status.value, execution_id=execution_id)

    async def succeed(self, execution_id: str, result: Any, how: SuccessHow = "ran") -> None:
        try:
            await self._finish(
                execution_id,
                LedgerStatus.SUCCEEDED,
                SucceededBody(result=result, how=how),
                result=result,
            )
        except StaleOwnerError:
            raise
        except TendonError as exc:
            if exc.retryable:
                raise
            # E.g. a result over the offload threshold with no object store configured: it
            # will never fit, so say so instead of leaving the execution open.
            await self.fail(
                execution_id,
                {"code": exc.code, "message": f"the result could not be saved: {exc.message}"},
            )

    async def fail(self, execution_id: str, error: dict[str, str], how: FailureHow = "ran") -> None:
        await self._finish(execution_id, LedgerStatus.FAILED, FailedBody(error=error, how=how), error=error)

    async def mark_unknown(self, execution_id: str, reason: str) -> None:
        await self._finish(
            execution_id,
            LedgerStatus.UNKNOWN,
            UnknownBody(reason=reason),
            error={"code": "unknown", "message": reason},
        )

    # ---- running ------------------------------------------------------------------------

    async def run(self, execution_id: str, reason: StartReason = "first_run") -> None:
        """Start (or re-start) the body of an execution this worker owns and save its outcome."""
        row = await self._row(execution_id)
        with bound_contextvars(execution_id=execution_id, turn_id=row.turn_id, tool=row.tool):
            tool = self.registry.served(row.tool, row.binding_digest)
            if tool is None:
                # Only reachable from ACCEPTED (the replay rule never re-runs an unserved
                # tool), so nothing ran: rejecting is safe.
                await self.fail(
                    execution_id,
                    {
                        "code": "routing_error",
                        "message": f"tool {row.tool} with binding digest {row.binding_digest} "
                        f"is no longer served by route {row.route}",
                    },
                    how="rejected",
                )
                return
            if row.cancel_requested:
                await self._finish(
                    execution_id,
                    LedgerStatus.CANCELLED,
                    CancelledBody(reason="cancel requested before the tool started"),
                )
                return
            attempt = await self._start(execution_id, reason)
            await self._body(row, tool, attempt)

    async def _start(self, execution_id: str, reason: StartReason) -> int:
        async def work(conn: asyncpg.Connection) -> int:
            row = await ledger.lock_owned(conn, execution_id, self.worker_id)
            attempt = row.attempts + 1
            await ledger.move(conn, row, LedgerStatus.RUNNING, attempts=attempt)
            await ledger.append_event(
                conn,
                self.codec,
                execution_id,
                StartedBody(attempt=attempt, worker=self.worker_id, reason=reason),
            )
            return attempt

        attempt = await self.commit(execution_id, work)
        log.info("execution_started", attempt=attempt, reason=reason)
        return attempt

    def _context(self, execution_id: str, attempt: int, *, output: bool) -> ToolContext:
        cancelled = self._cancelled.setdefault(execution_id, asyncio.Event())
        ctx = ToolContext(operation_id=execution_id, attempt=attempt, cancelled=cancelled)
        if output:
            ctx.output = LedgerOutput(self, execution_id)
        return ctx

    async def _body(self, row: Execution, tool: Tool, attempt: int) -> None:
        execution_id = row.execution_id
        self.kill.hit("hands.before_tool_body", row.call_id)
        ctx = self._context(execution_id, attempt, output=True)
        try:
            args = tool.validate_args(row.args or {})
            result = _jsonable(await tool.fn(ctx, **args))
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
        self.kill.hit("hands.after_tool_body", row.call_id)
        await self.succeed(execution_id, result)

    async def _tool_stopped(self, row: Execution, ctx: ToolContext, exc: BaseException) -> None:
        """Save the outcome of a body that raised: CANCELLED if a cancel was asked, else FAILED."""
        execution_id = row.execution_id
        self.kill.hit("hands.after_tool_body", row.call_id)
        if ctx.cancelled.is_set():
            await self._finish(
                execution_id,
                LedgerStatus.CANCELLED,
                CancelledBody(reason=f"cancel requested; the tool stopped with {_describe(exc)}"),
            )
            return
        if isinstance(exc, asyncio.CancelledError):
            await self.fail(
                execution_id,
                {"code": "tool_error", "message": "CancelledError: the tool cancelled itself"},
            )
            return
        code = "bad_result" if isinstance(exc, BadResultError) else "tool_error"
        log.info("tool_raised", error=_describe(exc))
        await self.fail(execution_id, {"code": code, "message": _describe(exc)})

    # ---- recovery -----------------------------------------------------------------------

    async def recover(self, row: Execution) -> None:
        """Apply the replay rule to an execution just claimed from a dead owner."""
        with bound_contextvars(execution_id=row.execution_id, turn_id=row.turn_id, tool=row.tool):
            served = self.registry.served(row.tool, row.binding_digest)
            decision = decide(
                row.status,
                row.replay_policy or "unsafe",
                served.binding.replay_policy if served else None,
                bool(served and served.query),
                tool=row.tool or "an unknown tool",
            )
            log.info("recovering", action=decision.action.value, reason=decision.reason)
            if decision.action is Recovery.START:
                await self.run(row.execution_id, "first_run")
            elif decision.action is Recovery.RERUN:
                await self.run(row.execution_id, "rerun_after_crash")
            elif decision.action is Recovery.QUERY:
                assert served is not None
                await self.query(row, served)
            else:
                await self.mark_unknown(row.execution_id, decision.reason)

    async def query(self, row: Execution, tool: Tool) -> None:
        """Ask the tool's query about the original operation; never re-run blindly."""
        execution_id = row.execution_id

        async def to_querying(conn: asyncpg.Connection) -> None:
            current = await ledger.lock_owned(conn, execution_id, self.worker_id)
            await ledger.move(conn, current, LedgerStatus.QUERYING)

        await transact(self.pool, to_querying)  # no event: the Brain still sees "started"
        assert tool.query is not None
        ctx = self._context(execution_id, max(row.attempts, 1), output=False)
        try:
            args = tool.validate_args(row.args or {})
            answer = await tool.query(ctx, **args)
            if isinstance(answer, Found):
                result = _jsonable(answer.result)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self.mark_unknown(
                execution_id,
                f"worker died inside the body of unsafe tool {tool.name} and its query could "
                f"not tell whether operation {execution_id} happened: {_describe(exc)}",
            )
            return
        if isinstance(answer, Found):
            log.info("query_found")
            await self.succeed(execution_id, result, how="verified_by_query")
        elif isinstance(answer, NotFound):
            # The external system never saw the operation: running it now is its first effect.
            log.info("query_not_found")
            await self.run(execution_id, "rerun_after_crash")
        else:
            await self.mark_unknown(
                execution_id,
                f"the query of {tool.name} returned {type(answer).__name__}, expected Found or NotFound",
            )
