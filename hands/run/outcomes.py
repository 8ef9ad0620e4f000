"""Saving what happens to an execution this worker owns: every change one fenced ledger commit
that also appends its event (invariant 2), output pages with their offsets, the outcomes, and
what to do with an execution whose task failed for good (salvage, release).

A commit whose connection broke may have landed or not (``transact`` raises TransientError,
outcome unknown), so :meth:`Outcomes.save` never repeats one blindly: before trying again it
looks at the locked row to see whether the earlier attempt is already in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

from hands.rules.states import OPEN_STATUSES, LedgerStatus
from hands.run.tasks import Tasks, passing
from hands.run.writer import LedgerWriter
from hands.store import PARKED_PREFIX, Change, Execution, Ledger
from infra.db import Connection
from infra.process.logging import get_logger
from protocol import (
    FailedBody,
    InputRequiredBody,
    OutputPageBody,
    StaleOwnerError,
    SucceededBody,
    TendonError,
    UnknownBody,
    codec,
)
from protocol.storable import describe, storable

log = get_logger(__name__)
T = TypeVar("T")
Build = Callable[[Execution], Awaitable[Change | None]]

SuccessHow = Literal["ran", "verified_by_query", "reconciled"]
FailureHow = Literal["ran", "rejected", "verified_by_query", "reconciled"]
# How long a state change waits out a passing database or object-store fault before giving up.
# Giving up on the outcome of a body that already ran would cost a re-run or an UNKNOWN, so it
# waits as long as this worker is alive: the database back, it commits (fenced by ownership);
# presumed dead meanwhile, it is fenced out (``abandon``) and the new owner's replay rule decides.
SAVE_PATIENCE = float("inf")


class Outcomes:
    """What the executions of this worker (its ``tasks``) save: each change one fenced commit
    through the ``writer`` into the ``ledger``. ``hands.run.executor.Executor`` runs the bodies."""

    def __init__(self, tasks: Tasks, *, ledger: Ledger, writer: LedgerWriter) -> None:
        self._tasks = tasks
        self.ledger = ledger
        self.writer = writer
        # The row as this worker's last commit left it, per execution it runs (see ``save``).
        self._rows: dict[str, Execution] = {}

    @property
    def worker_id(self) -> str:
        return self._tasks.worker_id

    def remember(self, row: Execution) -> None:
        """``row`` is as this worker just committed it: the next change can go by it."""
        self._rows[row.execution_id] = row

    async def settled(self, execution_id: str, work: Callable[[], Awaitable[None]]) -> None:
        """Run an execution's ``work`` (its task, ``Executor.launch``), and if it fails in a way
        that leaves the row open, close the row or release it: never open with nobody on it."""
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
            if self._tasks.abandoned is not None:
                log.warning("execution_abandoned", execution_id=execution_id, error=describe(exc))
            elif passing(exc):
                log.exception("execution_interrupted_by_a_fault", execution_id=execution_id)
                await self.release(execution_id)
            else:
                log.exception("execution_crashed", execution_id=execution_id)
                await self.salvage(execution_id, exc)
        finally:
            self._rows.pop(execution_id, None)

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
            self._tasks.fence()
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
            self._tasks.fence()
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

        async def work(conn: Connection) -> dict[str, Any] | None:
            nonlocal offset
            row = await self.ledger.lock_owned(conn, execution_id, self.worker_id)
            # Only this task writes this execution's output, so a chunk at the offset the earlier
            # attempt got, with these bytes, is that attempt's.
            if offset is not None and await self.ledger.has_output(conn, execution_id, offset, data):
                return None
            offset, seq = await self.ledger.add_output(conn, row, data)
            return await self.writer.event(
                execution_id, row.header, seq, OutputPageBody(offset=offset, data=data)
            )

        event = await self._patiently(lambda: self.ledger.transact(work))
        self._rows.pop(execution_id, None)  # its seq moved on
        if event is not None:
            self.writer.sent([event])

    async def ask(self, execution_id: str, key: str, message: str, requests: dict[str, Any]) -> None:
        """Commit an ``input_required`` event (``ctx.ask_input``): the Brain shows the turn's
        person the question. Once per key: a worker that took the execution over and finds the
        question still open asks nothing again (the event is in the row)."""

        async def build(row: Execution) -> Change | None:
            if any(_asked(event, key) for event in row.events):
                return None
            body = InputRequiredBody(key=key, message=message, requests=requests)
            events = await self.writer.events(execution_id, row.header, row.last_seq + 1, body)
            return Change(row, row.status, events)

        await self.save(execution_id, build, landed=lambda row: any(_asked(e, key) for e in row.events))

    async def answer(self, execution_id: str, key: str) -> dict[str, Any] | None:
        """The answer a person gave to question ``key`` (``ctx.given_input``), None until then."""
        row = await self._patiently(lambda: self.row(execution_id))
        given = codec.loads(row.inputs) if row.inputs else {}
        found = given.get(key)
        return dict(found) if isinstance(found, dict) else None

    async def confirm_owner(self, execution_id: str) -> None:
        """Return once the ledger says this worker still holds the execution open; raise
        StaleOwnerError once it does not (released by a judgement that presumed this worker dead,
        however the others judged it, and maybe taken over). One read, tried again while the
        database is away: a tool that asked must not act on a guess."""
        owned = await self._patiently(
            lambda: self.ledger.read(lambda conn: self.ledger.owns(conn, execution_id, self.worker_id))
        )
        if not owned:
            raise StaleOwnerError(
                f"execution {execution_id} is no longer held by worker {self.worker_id}: it was "
                "handed over (or closed) while this worker was not looking"
            )

    async def keep_handle(self, execution_id: str, handle: str) -> None:
        """Commit the durable handle a body got (``ctx.keep_handle``); StaleOwnerError if this
        worker no longer holds the execution. Tried again after a passing fault: writing the same
        handle twice is harmless."""
        kept = await self._patiently(
            lambda: self.ledger.transact(
                lambda conn: self.ledger.keep_handle(conn, execution_id, self.worker_id, handle)
            )
        )
        if not kept:
            raise StaleOwnerError(f"execution {execution_id} is no longer held by worker {self.worker_id}")

    async def park(self, execution_id: str, handle: str, wake_in: float, awaiting: str | None) -> None:
        """Park the execution (``Park``, ``Ledger.park``): it keeps ``handle``, this worker lets go
        of it, and a recovery scan takes it up again once due. StaleOwnerError if this worker no
        longer holds it. Tried again after a passing fault: parking twice is parking once."""

        async def work(conn: Connection) -> bool:
            row = await self.ledger.get(conn, execution_id)
            if row is not None and row.owner == PARKED_PREFIX + self.worker_id:
                return True  # an earlier attempt landed
            return await self.ledger.park(conn, execution_id, self.worker_id, handle, wake_in, awaiting)

        if not await self._patiently(lambda: self.ledger.transact(work)):
            raise StaleOwnerError(f"execution {execution_id} is no longer held by worker {self.worker_id}")
        self._rows.pop(execution_id, None)

    async def _patiently(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()``, tried again after a passing fault (each pause longer) for as long as this
        worker commits (an attempt must be safe to repeat)."""
        failures = 0
        while True:
            self._tasks.fence()
            try:
                return await attempt()
            except Exception as exc:
                if not passing(exc):
                    raise
                failures += 1
                await asyncio.sleep(min(2.0, 0.05 * 2 ** min(failures, 6)))

    async def row(self, execution_id: str) -> Execution:
        row = await self.ledger.read(lambda conn: self.ledger.get(conn, execution_id))
        assert row is not None, f"execution {execution_id} vanished from the ledger"
        return row

    # ---- outcomes ----------------------------------------------------------------------

    async def finish(self, execution_id: str, status: LedgerStatus, body: Any, **changes: Any) -> None:
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
        await self.finish(execution_id, LedgerStatus.SUCCEEDED, SucceededBody(result=result, how=how))

    async def fail(self, execution_id: str, error: dict[str, str], how: FailureHow = "ran") -> None:
        await self.finish(execution_id, LedgerStatus.FAILED, FailedBody(error=error, how=how), error=error)

    async def mark_unknown(self, execution_id: str, reason: str) -> None:
        error = {"code": "unknown", "message": reason}
        await self.finish(execution_id, LedgerStatus.UNKNOWN, UnknownBody(reason=reason), error=error)
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
            row = await self.row(execution_id)
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
        if self._tasks.abandoned is not None:
            return  # others already take this worker for dead: its rows are theirs to claim
        try:
            await self.ledger.transact(lambda conn: self.ledger.release(conn, execution_id, self.worker_id))
            log.warning("execution_released", execution_id=execution_id)
        except Exception:
            log.exception("execution_release_failed", execution_id=execution_id)


def _asked(event: dict[str, Any], key: str) -> bool:
    return event.get("kind") == "input_required" and (event.get("body") or {}).get("key") == key
