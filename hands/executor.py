"""Running accepted executions: start, body, output, outcome; and recovering orphans.

Every state change is one ledger transaction that also appends its event (invariant 2); the
tool body and its query run *outside* any transaction (a ten-minute tool never holds one).
Every commit checks that this worker still owns the row (fencing, invariant 10), and after
every commit the relay is woken to publish the new events.

A commit whose connection broke may have landed or not (``transact`` raises TransientError,
outcome unknown), so :meth:`Executor.save` never repeats one blindly: before trying again it
looks at the locked row to see whether the earlier attempt is already in.

An execution must never stay open under this live worker with nobody working on it: no other
worker would ever claim it (they only claim rows of dead owners). So a task that fails for
good closes its row (FAILED or UNKNOWN) or releases it to the replay rule, and the recovery
scan adopts any open row of this worker that has no task here (see ``hands.recovery``).

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
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)

from hands import ledger
from hands.ledger import Execution
from hands.registry import ToolRegistry
from hands.relay import EventRelay
from hands.replay import Recovery, decide
from hands.states import OPEN_STATUSES, LedgerStatus
from hands.tools import Found, NotFound, Tool, ToolContext
from infra.db import dialect, is_transient, storable, transact
from infra.killpoints import KillPoints
from infra.logging import get_logger
from infra.payloads import PayloadCodec
from protocol import (
    CancelledBody,
    ConflictError,
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
Change = Callable[[asyncpg.Connection, Execution], Awaitable[Execution | None]]  # the row after, if known
StartReason = Literal["first_run", "rerun_after_crash"]
SuccessHow = Literal["ran", "verified_by_query", "reconciled"]
FailureHow = Literal["ran", "rejected", "verified_by_query", "reconciled"]
# How long a state change waits out a passing database or object-store fault before giving up.
# Giving up on the outcome of a body that already ran would cost a re-run or an UNKNOWN, so it
# waits as long as this worker is alive: the database back, it commits (fenced by ownership);
# presumed dead meanwhile, it is fenced out (``abandon``) and the new owner's replay rule decides.
SAVE_PATIENCE = float("inf")


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
    """``Type: message``, storable."""
    text = str(exc)
    return storable(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def _passing(exc: BaseException) -> bool:
    """Whether the same step may work when tried again later: a service fault (connection,
    restart, object store), as opposed to data the database refuses or a bug."""
    return is_transient(exc) or is_retryable(exc)


class LedgerOutput:
    """A tool's output writer: every write is one committed page with its byte offset."""

    def __init__(self, executor: Executor, execution_id: str) -> None:
        self._executor = executor
        self._execution_id = execution_id

    async def write(self, data: str) -> None:
        if not data:
            return
        ex = self._executor
        offset: int | None = None  # where the last attempt put the page

        async def page(conn: asyncpg.Connection, row: Execution) -> None:
            nonlocal offset
            offset = await ledger.add_output(conn, self._execution_id, data)
            await ledger.append_event(
                conn, ex.codec, self._execution_id, OutputPageBody(offset=offset, data=data)
            )

        async def landed(conn: asyncpg.Connection, row: Execution) -> bool:
            # Only this task writes this execution's output, so a chunk at the offset the
            # earlier attempt got, with these bytes, is that attempt's.
            return offset is not None and await ledger.has_output(conn, self._execution_id, offset, data)

        await ex.save(self._execution_id, page, landed=landed)


class Executor:
    """Runs this worker's executions as tasks, at most ``concurrency`` at once.

    A caller takes a slot (``await slots.acquire()``) and reserves the execution id
    (:meth:`reserve`) before it commits to new work, then hands both over with :meth:`launch`;
    the task gives them back when it ends.
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
        # Execution ids this process works on: from reserve() until their task ends.
        self._reserved: set[str] = set()
        self._cancelled: dict[str, asyncio.Event] = {}
        self._abandoned: str | None = None  # why this worker stopped committing, once it did
        # The row as this worker's last commit left it, per execution it runs (see save()).
        self._rows: dict[str, Execution] = {}

    # ---- plumbing -----------------------------------------------------------------------

    def _fence(self) -> None:
        if self._abandoned is not None:
            raise StaleOwnerError(f"worker {self.worker_id} commits nothing more: {self._abandoned}")

    async def commit(
        self,
        execution_id: str,
        work: Callable[[asyncpg.Connection], Awaitable[T]],
        *,
        single_statement: bool = False,
    ) -> T:
        """One ledger transaction for ``execution_id``, then wake the relay."""
        self._fence()
        result = await transact(self.pool, work, single_statement=single_statement)
        self.relay.wake(execution_id)
        return result

    async def save(
        self,
        execution_id: str,
        change: Change,
        *,
        landed: Callable[[asyncpg.Connection, Execution], Awaitable[bool]] | None = None,
        patience: float = SAVE_PATIENCE,
        one_statement: bool = False,
    ) -> None:
        """Commit ``change`` on the row this worker owns (locked and fenced), waiting out
        passing faults for up to ``patience`` seconds (see ``SAVE_PATIENCE``).

        An attempt that failed may still have committed (a connection lost during COMMIT).
        So every later attempt first asks ``landed`` about the locked row and does nothing if
        the earlier attempt is already in; redoing it would add a second event or page.
        Without ``landed``, ``change`` must be harmless to repeat.

        ``one_statement``: ``change`` is one guarded statement on PostgreSQL (a
        :func:`ledger.move_and_append`). Then, if this worker knows the row as its last commit
        left it, the change runs on that row with no transaction and no lock around it: one
        round trip instead of four. A row that moved on meanwhile makes the guard refuse, and
        the locked path below decides.
        """
        tried = False
        moved: Execution | None = None
        known = self._rows.pop(execution_id, None)
        if one_statement and known is not None and dialect(self.pool) == "postgres":
            self._fence()
            try:
                async with self.pool.acquire() as conn:
                    moved = await change(conn, known)
            except ConflictError:
                pass  # not as this worker left it: the locked path looks
            except Exception as exc:
                if not _passing(exc):
                    raise
                tried = True  # it may have committed: the locked path asks ``landed`` first
            else:
                self.relay.wake(execution_id)
                self._remember(execution_id, moved)
                return

        async def work(conn: asyncpg.Connection) -> Execution | None:
            row = await ledger.lock_owned(conn, execution_id, self.worker_id)
            if tried and landed is not None and await landed(conn, row):
                log.info("unclear_commit_had_landed", execution_id=execution_id)
                return None
            return await change(conn, row)

        def retrying(state: RetryCallState) -> None:
            if state.attempt_number % 10 == 1:
                error = state.outcome.exception() if state.outcome is not None else None
                log.warning(
                    "save_waits_for_the_database",
                    execution_id=execution_id,
                    attempts=state.attempt_number,
                    error=_describe(error or Exception()),
                )

        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_passing),
            stop=stop_after_delay(patience),
            wait=wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.1),
            before_sleep=retrying,
            reraise=True,
        ):
            with attempt:
                try:
                    moved = await self.commit(execution_id, work)
                finally:
                    tried = True
        self._remember(execution_id, moved)

    def _remember(self, execution_id: str, moved: Execution | None) -> None:
        """Keep the row as a commit just left it; forget it when that is not known."""
        if moved is None:
            self._rows.pop(execution_id, None)
        else:
            self._rows[execution_id] = moved

    def reserve(self, execution_id: str) -> bool:
        """Take ``execution_id`` for this process before committing to work on it.

        False if something here already has it (a task, or another handler of the same
        command), or if this worker was abandoned. The recovery scan adopts open rows of this
        worker that nobody here reserved, so reserving *before* the commit is what keeps a
        command handler and the scan from running the same execution twice.
        """
        if self._abandoned is not None or execution_id in self._reserved:
            return False
        self._reserved.add(execution_id)
        return True

    def unreserve(self, execution_id: str) -> None:
        """Give back a reservation that did not lead to :meth:`launch`."""
        if execution_id not in self._tasks:
            self._reserved.discard(execution_id)

    @property
    def reserved(self) -> frozenset[str]:
        return frozenset(self._reserved)

    def launch(self, execution_id: str, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work`` as this (reserved) execution's task; the caller's slot and reservation
        are released when it ends."""
        assert execution_id in self._reserved and execution_id not in self._tasks, execution_id
        # From now on a cancel for it reaches ``ctx.cancelled`` (or stops it before the start).
        self._cancelled.setdefault(execution_id, asyncio.Event())
        task = asyncio.create_task(self._guard(execution_id, work), name=f"execution-{execution_id}")
        self._tasks[execution_id] = task

    async def _guard(self, execution_id: str, work: Callable[[], Awaitable[None]]) -> None:
        try:
            await work()
        except asyncio.CancelledError:
            # Shutdown ran out of grace, or the worker was abandoned: the row stays open and,
            # once this worker counts as dead, the replay rule decides what happens to it.
            log.warning("execution_interrupted", execution_id=execution_id)
            raise
        except StaleOwnerError as exc:
            log.warning("execution_fenced", execution_id=execution_id, reason=exc.message)
        except Exception as exc:
            if self._abandoned is not None:
                log.warning("execution_abandoned", execution_id=execution_id, error=_describe(exc))
            elif _passing(exc):
                log.exception("execution_interrupted_by_a_fault", execution_id=execution_id)
                await self._release(execution_id)
            else:
                log.exception("execution_crashed", execution_id=execution_id)
                await self._salvage(execution_id, exc)
        finally:
            self._tasks.pop(execution_id, None)
            self._reserved.discard(execution_id)
            self._cancelled.pop(execution_id, None)
            self._rows.pop(execution_id, None)
            self.slots.release()

    async def _salvage(self, execution_id: str, exc: Exception) -> None:
        """Close an execution whose task failed in a way that trying again will not fix.

        Typically the body ran but PostgreSQL refuses its result (a ``"\\x00"`` in jsonb).
        Left alone, the row would stay open under this live worker forever. In order:

        - FAILED when that move is allowed: from ACCEPTED (nothing ran) or RUNNING (the body
          ran, and its outcome is what cannot be saved: code ``bad_result``);
        - else UNKNOWN (QUERYING, or the FAILED write was refused too): the body ran, and
          nothing is guessed;
        - if no write works, release the row: the replay rule takes over, and it never
          re-runs an unsafe tool. If even that fails, the recovery scan adopts the row.
        """
        detail = storable(exc.message) if isinstance(exc, TendonError) else _describe(exc)
        code = exc.code if isinstance(exc, TendonError) else "bad_result"
        try:
            row = await self._row(execution_id)
            if row.owner != self.worker_id or row.status not in OPEN_STATUSES:
                return  # closed after all (an unclear commit that landed), or not ours now
            if row.status is LedgerStatus.ACCEPTED:
                error = {"code": code, "message": f"the execution could not be started: {detail}"}
                await self.fail(execution_id, error, how="rejected")
                return
            if row.status is LedgerStatus.RUNNING:
                error = {
                    "code": code,
                    "message": f"the tool ran, but its outcome could not be saved: {detail}",
                }
                try:
                    await self.fail(execution_id, error)
                    return
                except Exception as again:
                    if isinstance(again, StaleOwnerError) or _passing(again):
                        raise
                    log.exception("failure_not_saved", execution_id=execution_id)
            await self.mark_unknown(
                execution_id,
                f"the outcome of {row.tool} could not be saved ({detail}), so whether operation "
                f"{execution_id} took effect is not on record",
            )
        except StaleOwnerError as fenced:
            log.warning("execution_fenced", execution_id=execution_id, reason=fenced.message)
        except Exception:
            log.exception("outcome_not_saved", execution_id=execution_id)
            await self._release(execution_id)

    async def _release(self, execution_id: str) -> None:
        """Give up ownership of an execution this worker could not finish (services down).

        The row is handed to a released-owner name that no live worker has, so the recovery
        scan (of any worker, this one included) applies the replay rule to it, exactly as if
        this process had died; nothing waits in this process's memory. If the release itself
        fails, the row is still this worker's with no task here, and the scan adopts it.
        """
        if self._abandoned is not None:
            return  # others already take this worker for dead: its rows are theirs to claim
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

    def abandon(self, reason: str) -> None:
        """Stop all local work now: this worker no longer counts as alive.

        Other workers may be claiming its executions already, so a body left running (even
        for the shutdown grace) would be a second copy of the same execution. Every local
        body is told (``ctx.cancelled``) and its task cancelled, and no commit, so no event,
        leaves this worker any more; the rows stay as they are, for the replay rule of
        whichever worker claims them.
        """
        if self._abandoned is not None:
            return
        self._abandoned = reason
        log.error("worker_abandoned", reason=reason, executions=len(self._tasks))
        for event in self._cancelled.values():
            event.set()
        for task in self._tasks.values():
            task.cancel()

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

        async def close(conn: asyncpg.Connection, row: Execution) -> Execution:
            # The output is sealed: every page was committed before this, so output_bytes
            # in the terminal event is the final length (invariant 8).
            final = body
            if isinstance(body, (SucceededBody, FailedBody)):
                final = body.model_copy(update={"output_bytes": row.output_bytes})
            return await ledger.move_and_append(conn, self.codec, row, status, final, **changes)

        async def landed(conn: asyncpg.Connection, row: Execution) -> bool:
            # Only the owner closes an open row, so a closed row this worker still owns was
            # closed by the earlier attempt.
            return row.status not in OPEN_STATUSES

        await self.save(execution_id, close, landed=landed, one_statement=True)
        if status is not LedgerStatus.UNKNOWN:  # mark_unknown says more
            log.info("execution_" + status.value, execution_id=execution_id)

    async def succeed(self, execution_id: str, result: Any, how: SuccessHow = "ran") -> None:
        # A result that can never be saved (PostgreSQL refuses it, or it is over the offload
        # threshold with no object store) raises here and _guard's _salvage closes the row.
        await self._finish(
            execution_id,
            LedgerStatus.SUCCEEDED,
            SucceededBody(result=result, how=how),
            result=result,
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
        # Someone has to act: nothing resolves an UNKNOWN but an explicit reconcile.
        log.warning(
            "execution_unknown",
            execution_id=execution_id,
            reason=reason,
            resolve=f"hands reconcile {execution_id} --result JSON --evidence TEXT "
            "(or --failed MESSAGE), once you know what happened",
        )

    # ---- running ------------------------------------------------------------------------

    async def run(
        self, execution_id: str, reason: StartReason = "first_run", row: Execution | None = None
    ) -> None:
        """Start (or re-start) the body of an execution this worker owns and save its outcome.

        ``row`` is the ledger row as the caller just committed it, if it has it (saves a read).
        """
        row = row or await self._row(execution_id)
        self._rows[execution_id] = row  # as committed just now: the start can go by it
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
            attempt = await self._start(execution_id, reason, cancel_asked=row.cancel_requested)
            if attempt is None:
                log.info("execution_cancelled_before_start")
                return
            await self._body(row, tool, attempt)

    async def _start(self, execution_id: str, reason: StartReason, *, cancel_asked: bool) -> int | None:
        """Start the body (the attempt's number), or, if a cancel was asked for (here, in the
        row this worker knows, or in the row as committed by any worker), end it CANCELLED
        instead (None): a cancel that comes before the body means the body never runs."""
        attempt: int | None = 0

        async def start(conn: asyncpg.Connection, row: Execution) -> Execution:
            nonlocal attempt
            if cancel_asked or row.cancel_requested or self._cancel_asked(execution_id):
                attempt = None
                cancelled = CancelledBody(reason="cancel requested before the tool started")
                return await ledger.move_and_append(conn, self.codec, row, LedgerStatus.CANCELLED, cancelled)
            attempt = row.attempts + 1
            started = StartedBody(attempt=attempt, worker=self.worker_id, reason=reason)
            return await ledger.move_and_append(
                conn, self.codec, row, LedgerStatus.RUNNING, started, unless_cancelled=True, attempts=attempt
            )

        async def landed(conn: asyncpg.Connection, row: Execution) -> bool:
            # Only the owner counts attempts or closes a row, so this is the earlier attempt's.
            if attempt is None:
                return row.status is LedgerStatus.CANCELLED
            return row.status is LedgerStatus.RUNNING and row.attempts == attempt

        await self.save(execution_id, start, landed=landed, one_statement=True)
        if attempt is not None:
            log.info("execution_started", attempt=attempt, reason=reason)
        return attempt

    def _cancel_asked(self, execution_id: str) -> bool:
        event = self._cancelled.get(execution_id)
        return event is not None and event.is_set()

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

    async def adopt(self, execution_id: str) -> None:
        """Recover an open execution this worker owns but has no task for.

        That happens when a commit's outcome was unclear (an accept that did land, a claim)
        or a release failed. Nothing here knows how far the body got, so it is treated like
        an orphan: the replay rule decides.
        """
        row = await self._row(execution_id)
        if row.owner != self.worker_id or row.status not in OPEN_STATUSES:
            return  # closed or released meanwhile
        log.warning("execution_adopted", execution_id=execution_id, status=row.status.value)
        await self.recover(row)

    async def recover(self, row: Execution) -> None:
        """Apply the replay rule to an execution claimed from a dead owner (or adopted)."""
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

        async def to_querying(conn: asyncpg.Connection, current: Execution) -> None:
            await ledger.move(conn, current, LedgerStatus.QUERYING)

        # No event: the Brain still sees "started". QUERYING -> QUERYING is allowed, so a
        # repeat after an unclear commit is harmless.
        await self.save(execution_id, to_querying)
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
