"""Running accepted executions: start, body, output, outcome; and recovering orphans.

Every state change is one ledger commit that also appends its event (invariant 2); the tool body
and its query run *outside* any transaction (a ten-minute tool never holds one). Every commit
checks that this worker still owns the row (fencing, invariant 10), and hands the events it
committed to the relay.

A commit whose connection broke may have landed or not (``transact`` raises TransientError,
outcome unknown), so :meth:`Executor.save` never repeats one blindly: before trying again it
looks at the locked row to see whether the earlier attempt is already in.

Kill points on this path (armed with ``TENDON_KILL_AT``, tag = the tool call id):
``hands.before_tool_body`` and ``hands.after_tool_body`` (the body returned, so the external
system may have acted, but nothing about it is saved yet).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic_core import to_jsonable_python
from structlog.contextvars import bound_contextvars

from hands.registry import ToolRegistry
from hands.replay import Recovery, decide
from hands.states import OPEN_STATUSES, LedgerStatus
from hands.store import Change, Execution, Ledger
from hands.tasks import Tasks, describe, passing
from hands.tools import Found, NotFound, Tool, ToolContext
from hands.writer import LedgerWriter
from infra.db import storable
from infra.killpoints import KillPoints
from infra.logging import get_logger
from protocol import (
    CancelledBody,
    FailedBody,
    OutputPageBody,
    OutputPageEvent,
    StaleOwnerError,
    StartedBody,
    SucceededBody,
    TendonError,
    UnknownBody,
    codec,
)

log = get_logger(__name__)
Build = Callable[[Execution], Awaitable[Change | None]]
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


class LedgerOutput:
    """A tool's output writer: every write is one committed page with its byte offset."""

    def __init__(self, executor: Executor, execution_id: str) -> None:
        self._executor = executor
        self._execution_id = execution_id

    async def write(self, data: str) -> None:
        if data:
            await self._executor.page(self._execution_id, data)


class Executor(Tasks):
    def __init__(
        self,
        *,
        ledger: Ledger,
        writer: LedgerWriter,
        registry: ToolRegistry,
        worker_id: str,
        kill: KillPoints,
        concurrency: int,
    ) -> None:
        super().__init__(worker_id, concurrency)
        self.ledger = ledger
        self.writer = writer
        self.registry = registry
        self.kill = kill

    # ---- saving ------------------------------------------------------------------------

    async def save(
        self, execution_id: str, build: Build, *, landed: Callable[[Execution], bool] | None = None,
        patience: float = SAVE_PATIENCE,
    ) -> None:  # fmt: skip
        """Commit what ``build`` makes of the row this worker owns, waiting out passing faults
        for up to ``patience`` seconds (see ``SAVE_PATIENCE``).

        If this worker knows the row as its last commit left it, the change goes with the other
        tasks' changes of the moment, guarded by that row (no lock, no read). A row that moved on
        meanwhile makes the guard refuse it, and the locked way decides. An attempt that failed
        may still have committed (a connection lost during COMMIT): every later attempt first
        asks ``landed`` about the locked row and does nothing if the earlier one is already in.
        """
        tried = False
        known = self._rows.pop(execution_id, None)
        if known is not None:
            self.fence()
            try:
                change = await build(known)
                moved = await self.writer.change(change) if change is not None else known
            except Exception as exc:
                if not passing(exc):
                    raise
                tried = True  # it may have committed: the locked path asks ``landed`` first
            else:
                if moved is not None:
                    self._rows[execution_id] = moved
                    return
        deadline = asyncio.get_running_loop().time() + patience
        failures = 0
        while True:
            self.fence()
            try:
                moved = await self.writer.change_locked(
                    execution_id, self.worker_id, build, landed if tried and landed is not None else None
                )
            except Exception as exc:
                if not passing(exc) or asyncio.get_running_loop().time() >= deadline:
                    raise
                tried = True
                failures += 1
                if failures % 10 == 1:
                    log.warning("save_waits_for_the_database", execution_id=execution_id, attempts=failures,
                                error=describe(exc))  # fmt: skip
                await asyncio.sleep(min(2.0, 0.05 * 2 ** min(failures, 6)))
                continue
            if moved is not None:
                self._rows[execution_id] = moved
            return

    async def page(self, execution_id: str, data: str) -> None:
        """Commit one output page (its offset and seq) and hand its event to the relay."""
        offset: int | None = None  # where the last attempt put the page
        failures = 0
        while True:
            self.fence()
            try:

                async def work(conn: Any) -> dict[str, Any] | None:
                    nonlocal offset
                    row = await self.ledger.lock_owned(conn, execution_id, self.worker_id)
                    # Only this task writes this execution's output, so a chunk at the offset the
                    # earlier attempt got, with these bytes, is that attempt's.
                    if offset is not None and await self.ledger.has_output(conn, execution_id, offset, data):
                        return None
                    offset, seq = await self.ledger.add_output(conn, row, data)
                    envelope = OutputPageEvent(
                        execution_id=execution_id, namespace=row.namespace, session_id=row.session_id,
                        request_digest=row.request_digest, seq=seq,
                        body=OutputPageBody(offset=offset, data=data),
                    )  # fmt: skip
                    return await self.writer.codec.pack_data(envelope)

                event = await self.ledger.transact(work)
            except Exception as exc:
                if not passing(exc):
                    raise
                failures += 1
                await asyncio.sleep(min(2.0, 0.05 * 2 ** min(failures, 6)))
                continue
            self._rows.pop(execution_id, None)  # its seq moved on
            if event is not None:
                self.writer.sent([event])
            return

    async def _row(self, execution_id: str) -> Execution:
        row = await self.ledger.read(lambda conn: self.ledger.get(conn, execution_id))
        assert row is not None, f"execution {execution_id} vanished from the ledger"
        return row

    # ---- outcomes ----------------------------------------------------------------------

    async def _finish(self, execution_id: str, status: LedgerStatus, body: Any, **changes: Any) -> None:
        """Move to a final (or UNKNOWN) status and append its event, in one commit."""

        async def close(row: Execution) -> Change:
            # The output is sealed: every page was committed before this, so output_bytes in
            # the terminal event is the final length (invariant 8).
            final = body
            if isinstance(body, (SucceededBody, FailedBody)):
                final = body.model_copy(update={"output_bytes": row.output_bytes})
            events = await self.writer.events(execution_id, row.header, row.last_seq + 1, final)
            return Change(row, status, events, **changes)

        # Only the owner closes an open row, so a closed row this worker still owns was closed by
        # the earlier attempt.
        await self.save(execution_id, close, landed=lambda row: row.status not in OPEN_STATUSES)
        if status is not LedgerStatus.UNKNOWN:  # mark_unknown says more
            log.info("execution_" + status.value, execution_id=execution_id)

    async def succeed(self, execution_id: str, result: Any, how: SuccessHow = "ran") -> None:
        # A result that can never be saved (PostgreSQL refuses it, or it is over the offload
        # threshold with no object store) raises here and the task's salvage closes the row.
        await self._finish(execution_id, LedgerStatus.SUCCEEDED, SucceededBody(result=result, how=how))

    async def fail(self, execution_id: str, error: dict[str, str], how: FailureHow = "ran") -> None:
        await self._finish(execution_id, LedgerStatus.FAILED, FailedBody(error=error, how=how), error=error)

    async def mark_unknown(self, execution_id: str, reason: str) -> None:
        error = {"code": "unknown", "message": reason}
        await self._finish(execution_id, LedgerStatus.UNKNOWN, UnknownBody(reason=reason), error=error)
        # Someone has to act: nothing resolves an UNKNOWN but an explicit reconcile.
        log.warning(
            "execution_unknown",
            execution_id=execution_id,
            reason=reason,
            resolve=f"hands reconcile {execution_id} --result JSON --evidence TEXT "
            "(or --failed MESSAGE), once you know what happened",
        )

    async def salvage(self, execution_id: str, exc: Exception) -> None:
        """Close an execution whose task failed in a way that trying again will not fix.

        Typically the body ran but PostgreSQL refuses its result (a ``"\\x00"`` in jsonb). Left
        alone, the row would stay open under this live worker forever. In order: FAILED when
        that move is allowed (from ACCEPTED: nothing ran; from RUNNING: the body ran, and its
        outcome is what cannot be saved, code ``bad_result``); else UNKNOWN (QUERYING, or the
        FAILED write was refused too: the body ran, and nothing is guessed); if no write works,
        release the row to the replay rule, which never re-runs an unsafe tool.
        """
        detail = storable(exc.message) if isinstance(exc, TendonError) else describe(exc)
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
                    if isinstance(again, StaleOwnerError) or passing(again):
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
            await self.release(execution_id)

    async def release(self, execution_id: str) -> None:
        """Give up ownership of an execution this worker could not finish (services down): it goes
        to a released name no live worker has, so the recovery scan applies the replay rule to it,
        exactly as if this process had died. If the release fails too, the scan adopts the row."""
        if self._abandoned is not None:
            return  # others already take this worker for dead: its rows are theirs to claim
        try:
            await self.ledger.transact(lambda conn: self.ledger.release(conn, execution_id, self.worker_id))
            log.warning("execution_released", execution_id=execution_id)
        except Exception:
            log.exception("execution_release_failed", execution_id=execution_id)

    # ---- running -----------------------------------------------------------------------

    async def run(
        self, execution_id: str, reason: StartReason = "first_run", row: Execution | None = None
    ) -> None:
        """Start (or re-start) the body of an execution this worker owns and save its outcome.
        ``row``: the ledger row as the caller just committed it (RUNNING already: a safe tool
        accepted and started in one commit)."""
        row = row or await self._row(execution_id)
        self._rows[execution_id] = row  # as committed just now: the next change can go by it
        with bound_contextvars(execution_id=execution_id, turn_id=row.turn_id, tool=row.tool):
            tool = self.registry.served(row.tool, row.binding_digest)
            if tool is None:
                # Only reachable from ACCEPTED (the replay rule never re-runs an unserved tool),
                # so nothing ran: rejecting is safe.
                error = {
                    "code": "routing_error",
                    "message": f"tool {row.tool} with binding digest {row.binding_digest} "
                    f"is no longer served by route {row.route}",
                }
                await self.fail(execution_id, error, how="rejected")
                return
            if row.status is LedgerStatus.RUNNING and reason == "first_run":
                attempt: int | None = row.attempts
                if self.cancel_asked(execution_id):  # a cancel came between the commit and now
                    before = CancelledBody(reason="cancel requested before the tool started")
                    await self._finish(execution_id, LedgerStatus.CANCELLED, before)
                    return
            else:
                attempt = await self._start(execution_id, reason, cancel_asked=row.cancel_requested)
            if attempt is None:
                log.info("execution_cancelled_before_start")
                return
            await self._body(row, tool, attempt)

    async def _start(self, execution_id: str, reason: StartReason, *, cancel_asked: bool) -> int | None:
        """Start the body (the attempt's number), or, if a cancel was asked for (here, in the row
        this worker knows, or in the row as committed by any worker), end it CANCELLED instead
        (None): a cancel that comes before the body means the body never runs."""
        attempt: int | None = 0

        async def start(row: Execution) -> Change:
            nonlocal attempt
            if cancel_asked or row.cancel_requested or self.cancel_asked(execution_id):
                attempt = None
                body: Any = CancelledBody(reason="cancel requested before the tool started")
                events = await self.writer.events(execution_id, row.header, row.last_seq + 1, body)
                return Change(row, LedgerStatus.CANCELLED, events)
            attempt = row.attempts + 1
            body = StartedBody(attempt=attempt, worker=self.worker_id, reason=reason)
            events = await self.writer.events(execution_id, row.header, row.last_seq + 1, body)
            return Change(row, LedgerStatus.RUNNING, events, attempts=attempt, unless_cancelled=True)

        def landed(row: Execution) -> bool:
            # Only the owner counts attempts or closes a row, so this is the earlier attempt's.
            if attempt is None:
                return row.status is LedgerStatus.CANCELLED
            return row.status is LedgerStatus.RUNNING and row.attempts == attempt

        await self.save(execution_id, start, landed=landed)
        if attempt is not None:
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
            reason = f"cancel requested; the tool stopped with {describe(exc)}"
            await self._finish(execution_id, LedgerStatus.CANCELLED, CancelledBody(reason=reason))
            return
        if isinstance(exc, asyncio.CancelledError):
            await self.fail(
                execution_id, {"code": "tool_error", "message": "CancelledError: the tool cancelled itself"}
            )
            return
        code = "bad_result" if isinstance(exc, BadResultError) else "tool_error"
        log.info("tool_raised", error=describe(exc))
        await self.fail(execution_id, {"code": code, "message": describe(exc)})

    # ---- recovery ----------------------------------------------------------------------

    async def adopt(self, execution_id: str) -> None:
        """Recover an open execution this worker owns but has no task for (an unclear commit that
        landed, or a release that failed): nothing here knows how far the body got, so it is
        treated like an orphan and the replay rule decides."""
        row = await self._row(execution_id)
        if row.owner != self.worker_id or row.status not in OPEN_STATUSES:
            return  # closed or released meanwhile
        log.warning("execution_adopted", execution_id=execution_id, status=row.status.value)
        await self.recover(row)

    async def recover(self, row: Execution) -> None:
        """Apply the replay rule to an execution claimed from a dead owner (or adopted)."""
        with bound_contextvars(execution_id=row.execution_id, turn_id=row.turn_id, tool=row.tool):
            # Its owner may have died between a commit and its publish: what it committed goes
            # out again first (the Brain drops the seqs it has), so the Brain need not wait for
            # a gap or a stall to ask for it. Output pages are left to the Brain's gap replay.
            self.writer.sent(row.events)
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
                await self.run(row.execution_id, "first_run", row=row)
            elif decision.action is Recovery.RERUN:
                await self.run(row.execution_id, "rerun_after_crash", row=row)
            elif decision.action is Recovery.QUERY:
                assert served is not None
                await self.query(row, served)
            else:
                await self.mark_unknown(row.execution_id, decision.reason)

    async def query(self, row: Execution, tool: Tool) -> None:
        """Ask the tool's query about the original operation; never re-run blindly."""
        execution_id = row.execution_id

        async def to_querying(current: Execution) -> Change:
            return Change(current, LedgerStatus.QUERYING, [])

        # No event: the Brain still sees "started". QUERYING -> QUERYING is allowed, so a repeat
        # after an unclear commit is harmless.
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
                f"not tell whether operation {execution_id} happened: {describe(exc)}",
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
