"""Consumers of what Hands send: batches of sequenced execution events, and binding announcements.

A message of events (an ``EventBatch``: several executions' ranges) is acked only after its
effects are committed (or held behind a gap); the ranges of many messages share transactions
(``apply``, a group committer). A turn whose step the apply completes is claimed there and then
for a run of this Brain when it has a free slot, and handed to the scheduler after the commit: its
results go to the model without another commit or wake-up. The same transaction admits the next
calls of the batches whose calls it ended (``brain.run.batches``). What can never be applied is parked
in the dead-letter queue with a reason, one execution's part at a time, so that the rest of a
batch is applied; an object that fails verification also fails its turn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from structlog.contextvars import bound_contextvars

from brain.rules.states import TERMINAL_TURN
from brain.run.batches import admit_after_apply
from brain.run.context import BrainContext
from brain.run.history import ReadAhead
from brain.run.runs import Scheduler
from brain.store import Applied, ClaimBudget, TurnRow
from infra.db import Connection
from infra.db.groupcommit import GroupCommit
from infra.process.logging import get_logger
from infra.transport import Delivery, Transport
from infra.transport.delivery import handle_patiently
from protocol import (
    TERMINAL_EVENT_KINDS,
    BindingsAnnouncement,
    EventBatch,
    ObjectRefError,
    ParkedError,
    ProtocolError,
    TendonError,
    ToolBinding,
    decode,
    encode,
)

log = get_logger(__name__)

EVENT_KINDS = TERMINAL_EVENT_KINDS | {"accepted", "started", "output_page", "unknown"}
Range = list[Any]  # one execution's events of one message, in seq order


def ranges_of(envelope: Any) -> list[Range] | None:
    """The per-execution ranges of a message (an event batch, or one event as earlier versions
    sent them); None for anything that is not execution events."""
    if isinstance(envelope, EventBatch):
        events = list(envelope.events)
    elif getattr(envelope, "kind", None) in EVENT_KINDS:
        events = [envelope]
    else:
        return None
    by_execution: dict[str, Range] = {}
    for event in events:
        by_execution.setdefault(event.execution_id, []).append(event)
    return [sorted(r, key=lambda e: e.seq) for r in by_execution.values()]


class UpdateConsumer:
    def __init__(self, ctx: BrainContext, broker: Transport, scheduler: Scheduler | None) -> None:
        self.ctx = ctx
        self.broker = broker
        self.scheduler = scheduler
        self.queue = broker.topology.updates
        self.applier: GroupCommit[Range, Any] = GroupCommit(
            partial(ctx.store.transact, held=ctx.store.held()),
            self._apply,
            name="updates",
            order=lambda r: r[0].execution_id,
            orphaned=self._orphaned,
        )

    async def _apply(self, conn: Connection, ranges: list[Range]) -> list[Any]:
        """One transaction for the ranges ready together: per range, the turns it claimed for
        this Brain, or its refusal."""
        budget = None
        if self.scheduler is not None and self.scheduler.free:
            budget = ClaimBudget(self.ctx.owner, self.ctx.lease_seconds, self.scheduler.free)
        applied = await self.ctx.store.events.apply_events(
            conn, ranges, wake_channel=self.ctx.wake_channel, budget=budget
        )
        admitted = await admit_after_apply(self.ctx, conn, applied.ended)  # batches' next children
        read = self._read_ahead(applied)
        results: list[Any] = []
        # Each execution this apply ended goes to the first range that names it: two ranges of one
        # execution (an event that came again beside the first delivery) end it once, and it is
        # measured once.
        told: set[str] = set()
        for events, (refused, claimed) in zip(ranges, applied.by_range(), strict=True):
            mine = [e for e in dict.fromkeys(e.execution_id for e in events) if e not in told]
            ended = [applied.ended[e] for e in mine if e in applied.ended]
            told.update(mine)
            if refused is not None:
                results.append(refused)
                continue
            results.append((claimed, ended, applied, read, admitted))
            admitted = []  # sent once, by the first range's caller
        return results

    def _read_ahead(self, applied: Applied) -> SharedRead | None:
        """What the model calls of the turns this apply claimed need and this process does not
        keep (their runs went on elsewhere, or long ago): read for all of them, not by each run,
        once the apply committed, on a connection of its own, while the next apply goes on (read
        inside it, the read held the applied turns' locks and the next batch for 10-40 ms). A
        conversation kept complete until the apply goes on without a read (``woken``)."""
        cold = [r for r in applied.claimed if not self.ctx.history.knew(r)]
        if not cold:
            return None
        threads = {r.thread_id for r in applied.claimed}
        upto = {turn_id: seq for turn_id, (seq, _) in applied.entries.items()}
        outcomes = applied.outcomes

        async def read(conn: Connection) -> ReadAhead:
            await self.ctx.threads.get_many(conn, threads)
            return await self.ctx.history.read_ahead(conn, cold, outcomes, upto)

        return SharedRead(lambda: self.ctx.store.read(read))

    async def handle(self, message: Delivery) -> None:
        """Apply one message; whatever happens, it is acked, parked or requeued."""
        await handle_patiently(message, self._handle, what="an update")

    async def _handle(self, message: Delivery) -> None:
        arrived = time.monotonic()
        try:
            envelope = decode(message.body)
        except ProtocolError as exc:
            await self.broker.dead_letter(self.queue, message, str(exc))
            return
        ranges = ranges_of(envelope)
        if ranges is None:
            await self.broker.dead_letter(self.queue, message, f"{envelope.kind} is not an execution event")
            return
        for events in ranges:
            for event in events:
                self.ctx.killpoints.hit("brain.after_update_received", event.kind)
        if len(ranges) == 1:  # the usual message: applied in this task, no task gathered for it
            try:
                outcomes: list[Any] = [await self._one(ranges[0])]
            except Exception as exc:  # noqa: BLE001 - judged below, as gather's would be
                outcomes = [exc]
        else:
            outcomes = await asyncio.gather(*(self._one(r) for r in ranges), return_exceptions=True)
        refused: list[tuple[Range, str]] = []
        for events, outcome in zip(ranges, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, TendonError) or outcome.retryable:
                    raise outcome  # e.g. the database is away: waited out, the apply is idempotent
                refused.append((events, str(outcome)))
        if len(refused) < len(ranges):
            self.ctx.metrics.apply_seconds.observe(time.monotonic() - arrived)
        for events in ranges:
            for event in events:
                self.ctx.killpoints.hit("brain.after_apply_commit", event.kind)  # committed, not acked
        if refused and len(refused) == len(ranges) == 1:
            await self.broker.dead_letter(self.queue, message, refused[0][1])
            return
        for events, reason in refused:
            part = EventBatch(events=events)
            await self.broker.park(self.queue, encode(part), message_id=part.message_id, reason=reason)
        await message.ack()

    async def _one(self, events: Range) -> list[TurnRow]:
        """Resolve one execution's events (a body by reference is fetched and verified) and apply
        them; the turns this claimed for a run here, or raises the refusal."""
        first = events[0]
        with bound_contextvars(execution_id=first.execution_id, seq=first.seq, kind=first.kind):
            try:
                resolved = [await self.ctx.codec.resolve(e) for e in events]
            except ObjectRefError as exc:
                error = {
                    "code": exc.code,
                    "message": f"update {first.kind} #{first.seq} of "
                    f"execution {first.execution_id} refused: {exc.message}",
                }
                await self._fail_turn_of(first, error)
                raise ObjectRefError(error["message"]) from exc
            claimed, ended, applied, read, admitted = await self.applier.submit(resolved)
            if admitted:
                self.ctx.commands.send(admitted)
            for tool in ended:
                self.ctx.metrics.tool_ended(tool.tool, tool.status, tool.created_at)
            for row in claimed:  # committed: the run goes on from what this apply wrote
                seq, facts = applied.entries[row.id]
                self.ctx.history.woken(row, seq, facts, applied.outcomes)
            if read is not None and claimed:
                try:
                    conversations = await read.result()
                except asyncio.CancelledError:
                    self._adopt(claimed)  # its runs read their own conversations
                    raise
                if conversations is not None:
                    self.ctx.history.keep(conversations, claimed)
            self._adopt(claimed)
            log.debug("update_applied", events=len(resolved), claimed=len(claimed))
            return claimed  # type: ignore[no-any-return]

    def _adopt(self, claimed: Sequence[TurnRow]) -> None:
        """Hand the turns an apply claimed for this Brain to its scheduler. Whatever becomes of the
        handler after the commit (a channel the broker closes cancels its consumers' handlers),
        this happens, or the turns would wait out a lease with nobody running them."""
        for row in claimed:
            log.info("run_started", turn_id=row.id, run=row.runs, phase="wait_tools", epoch=row.lease_epoch)
            if self.scheduler is not None:
                self.scheduler.adopt(row)

    def _orphaned(self, result: Any) -> None:
        """An apply that committed after its handler was cancelled: its claimed turns are still
        this Brain's to run (the message comes again, and applying it again is a no-op)."""
        if not isinstance(result, BaseException):
            self._adopt(result[0])
            if result[4]:
                self.ctx.commands.send(result[4])

    async def _fail_turn_of(self, header: Any, error: dict[str, str]) -> None:
        """Fail the turn of the execution an unverifiable update names, if the update's header is
        that execution's (scope and request digest): a message that merely names an execution id
        proves nothing, and is only parked."""
        store = self.ctx.store

        async def work(conn: Connection) -> Any:
            named = await store.executions.named_by(conn, header)
            if named is None:
                return None
            return await store.failures.fail_turn(
                conn, named["turn_id"], error, self.ctx.topology, wake_channel=self.ctx.wake_channel
            )

        settled = await store.transact(work)
        if settled is not None:
            self.ctx.failed(settled)

    async def surface_parked(self, conn: Connection, envelope: Any, reason: str) -> str | None:
        """Updates parked for good: a turn cannot go on past them, so it fails, saying why (unless
        they were applied after all, or the turn ended already)."""
        said = []
        for events in ranges_of(envelope) or []:
            first = events[-1]
            named = await self.ctx.store.executions.named_by(conn, first)
            if named is None or first.seq <= named["last_seq"] or named["turn_status"] in TERMINAL_TURN:
                continue
            error = ParkedError(
                f"update {first.kind} #{first.seq} of execution {first.execution_id} could not be "
                f"applied and was parked: {reason}"
            )
            # Its cancels are outbox rows: the control relay's sweep sends them once this commits.
            settled = await self.ctx.store.failures.fail_turn(
                conn, named["turn_id"], error.as_dict(), self.ctx.topology, wake_channel=self.ctx.wake_channel
            )
            if settled is not None:
                said.append(f"turn {named['turn_id']} failed: {error.message}")
        return "; ".join(said) or None


class BindingsConsumer:
    """Stores what Hands pools announce; the Brain never imports tool code."""

    def __init__(self, ctx: BrainContext, broker: Transport) -> None:
        self.ctx = ctx
        self.broker = broker
        self.queue = broker.topology.bindings

    async def handle(self, message: Delivery) -> None:
        await handle_patiently(message, self._handle, what="a bindings announcement")

    async def _handle(self, message: Delivery) -> None:
        try:
            announcement = decode(message.body)
            if not isinstance(announcement, BindingsAnnouncement) or announcement.body is None:
                raise ProtocolError("expected an inline bindings announcement")
            for b in announcement.body.bindings:
                _check_digest(b)
        except ProtocolError as exc:
            await self.broker.dead_letter(self.queue, message, str(exc))
            return
        bindings: Sequence[ToolBinding] = announcement.body.bindings
        store = self.ctx.store
        await store.transact(
            lambda conn: store.bindings.store_bindings(conn, bindings, self.ctx.wake_channel)
        )
        log.info("bindings_announced", route=announcement.body.route, tools=[b.name for b in bindings])
        await message.ack()


class SharedRead:
    """A read that the callers of one committed batch share: the first to ask starts it (after
    the commit: it reads what the batch wrote), the others wait for the same result. One that
    fails gives None: the runs then read their own conversations."""

    def __init__(self, start: Callable[[], Awaitable[ReadAhead]]) -> None:
        self._start = start
        self._task: asyncio.Task[ReadAhead | None] | None = None

    async def result(self) -> ReadAhead | None:
        if self._task is None:
            self._task = asyncio.create_task(self._read(), name="read-ahead")
        return await asyncio.shield(self._task)  # one caller's cancel is not the others'

    async def _read(self) -> ReadAhead | None:
        try:
            return await self._start()
        except Exception as exc:  # noqa: BLE001 - the runs read for themselves
            log.warning("read_ahead_failed", error=str(exc))
            return None


def _check_digest(binding: ToolBinding) -> None:
    fields: dict[str, Any] = binding.model_dump(exclude={"digest"})
    if ToolBinding.compute_digest(**fields) != binding.digest:
        raise ProtocolError(f"binding {binding.name} carries a digest that does not match its fields")
