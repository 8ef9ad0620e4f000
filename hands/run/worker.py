"""The command consumer: turns ``execute`` messages into accepted ledger rows, then work.

For each delivery (each command of a ``CommandBatch`` as if it had come alone: ``hands.run.parts``),
in this order (invariants 3 and 4):

1. decode strictly; anything that is not a valid ``execute`` command for this route is
   dead-lettered with a reason (it can never succeed, so redelivery would not help);
2. take a concurrency slot (prefetch = concurrency, so at most that many wait here);
3. resolve a ``body_ref``; one that fails verification is recorded as FAILED (so the turn
   hears about it) and the message dead-lettered;
4. dedup by execution id: the same request digest again is a duplicate (nothing runs again;
   the execution's events are made due again for a sender that may have missed them; ack),
   a different one is a conflict (dead-letter);
5. an unknown tool, binding digest or invalid arguments: commit FAILED + ``failed``
   (how="rejected") and ack;
6. otherwise commit ACCEPTED + ``accepted`` (for a safe tool: RUNNING + ``accepted`` and
   ``started``, since starting it again after a crash is what the replay rule would do anyway),
   pass the kill point ``hands.after_accept_commit`` (tag = call id), hand it to the executor
   (its body waits for the controls that waited when it came: ``hands.run.controls_first``),
   and ack once the events pending went out (``EventRelay.ack``: with a quick tool's outcome,
   else a linger later; at once when no slot is free; the tool does not wait for it). Accepts of
   commands handled at once share a commit (``hands.run.writer``).

A duplicate of a row that this worker owns, still open, with no task here, is our own accept
whose commit looked failed but landed (the message was handed back and came again): it is
acked and its execution started now instead of being left ACCEPTED under a live owner.

A passing fault (the database away) is waited out with the message unacked; anything else
that goes wrong hands it back after a pause (``infra.transport.delivery``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from structlog.contextvars import bound_contextvars

from hands.rules.commands import row_values, short, unstorable_names, unusable
from hands.rules.states import OPEN_STATUSES, LedgerStatus
from hands.run.controls_first import ControlsFirst
from hands.run.executor import Executor
from hands.run.parts import Batches, Part
from hands.run.relay import EventRelay
from hands.run.tasks import Tasks
from hands.run.writer import LedgerWriter
from hands.store import Execution, Ledger, NewExecution
from hands.tools.registry import ToolRegistry
from infra.db import Connection
from infra.db.retention import may_have_been_pruned
from infra.objects.payloads import PayloadCodec
from infra.process.killpoints import KillPoints
from infra.process.logging import get_logger
from infra.transport import Delivery, Transport
from infra.transport.delivery import handle_patiently
from protocol import (
    AcceptedBody,
    CommandBatch,
    ConflictError,
    ExecuteCommand,
    FailedBody,
    ObjectRefError,
    ParkedError,
    ProtocolError,
    ReplayPolicy,
    RoutingError,
    SchemaError,
    StartedBody,
    TendonError,
    UnknownBody,
    decode,
    request_digest,
)
from protocol.storable import storable, unstorable

log = get_logger(__name__)


@dataclass
class Slot:
    """The concurrency slot a command's handling holds: given back when the handling ends, unless
    the execution's task took it over (that gives it back when it ends)."""

    handed_over: bool = False


@dataclass(frozen=True)
class _Inserted:
    """What one insert-or-dedup transaction found."""

    row: Execution
    new: bool


class CommandConsumer:
    """Handles deliveries from ``<prefix>.<route>.commands``."""

    def __init__(
        self,
        *,
        route: str,
        queue: str,
        broker: Transport,
        codec: PayloadCodec,
        registry: ToolRegistry,
        ledger: Ledger,
        writer: LedgerWriter,
        tasks: Tasks,
        executor: Executor,
        relay: EventRelay,
        kill: KillPoints,
        first: ControlsFirst,
        ledger_horizon: float = 0.0,
    ) -> None:
        self.route = route
        self._first = first  # a body starts once the controls that waited for it are handled
        self._ledger_horizon = ledger_horizon  # seconds a finished row is kept (0: forever)
        self.queue = queue
        self._broker = broker
        self._codec = codec
        self._registry = registry
        self._ledger = ledger
        self._writer = writer
        self._tasks = tasks
        self._executor = executor
        self._relay = relay
        self._kill = kill
        self._stopping = asyncio.Event()
        self._batches = Batches(
            queue=queue, broker=broker, slots=tasks.slots, handle_one=self._in_slot, kill=kill,
            ack=self._ack,
        )  # fmt: skip
        self._busy = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def stop(self) -> None:
        """Stop taking new work; deliveries not yet accepted stay unacked (requeued on close)."""
        self._stopping.set()

    async def wait_idle(self, limit: float) -> None:
        """Wait (at most ``limit`` s) for handlers between 'slot taken' and 'acked'."""
        try:
            await asyncio.wait_for(self._idle.wait(), limit)
        except TimeoutError:
            log.warning("commands_still_accepting", handlers=self._busy)

    async def handle(self, message: Delivery) -> None:
        """aio-pika callback: one task per delivery; no exception ever leaves it."""
        await handle_patiently(message, self._handle, what="a command")

    async def _handle(self, message: Delivery) -> None:
        if self._stopping.is_set():
            return
        try:
            header = decode(message.body)
        except ProtocolError as exc:
            await self._dead_letter(message, f"{exc.code}: {exc.message}")
            return
        if isinstance(header, CommandBatch):
            await self._batches.handle(message, header.commands)
            return
        if not isinstance(header, ExecuteCommand):
            await self._dead_letter(
                message,
                f"schema_error: expected an execute command on {self.queue}, got a {header.kind} envelope",
            )
            return
        await self._tasks.slots.acquire()
        await self._in_slot(message, header)

    async def _in_slot(self, message: Delivery, header: ExecuteCommand) -> None:
        """Handle one command with the slot its caller took (given back unless it runs)."""
        if self._stopping.is_set():
            self._tasks.slots.release()
            return
        self._busy += 1
        self._idle.clear()
        slot = Slot()
        try:
            with bound_contextvars(execution_id=header.execution_id):
                await self._process(message, header, slot)
        finally:
            if not slot.handed_over:
                self._tasks.slots.release()
            self._busy -= 1
            if self._busy == 0:
                self._idle.set()

    async def _process(self, message: Delivery, header: ExecuteCommand, slot: Slot) -> None:
        """``slot``: marked handed over once the execution's task has it (accepted and started)."""
        problem = unstorable_names(header)
        if problem is not None:
            # Not even a rejection can be recorded under such a name: park it, saying why.
            await self._dead_letter(message, f"schema_error: {problem}")
            return
        try:
            command: ExecuteCommand = await self._codec.resolve(header)  # decoded once, above
        except ObjectRefError as exc:
            # The header is trustworthy enough to tell the turn; the body is not usable.
            await self._record_rejection(header, None, exc)
            await self._dead_letter(message, f"{exc.code}: {exc.message}")
            return
        except ProtocolError as exc:
            await self._dead_letter(message, f"{exc.code}: {exc.message}")
            return
        body = command.body
        assert body is not None
        problem = unusable(command, self.route, self.queue, names_checked=command is header)
        if problem is not None:
            await self._dead_letter(message, problem)
            return
        try:
            tool = self._registry.resolve(body.tool, body.binding_digest)
            if tool.binding.replay_policy != body.replay_policy:
                raise RoutingError(
                    f"command says tool {body.tool} is {body.replay_policy} but its binding "
                    f"{short(body.binding_digest)} is {tool.binding.replay_policy}"
                )
            problem = unstorable(body.args)  # first: a validation error would quote that text
            if problem is not None:
                raise SchemaError(f"the arguments of {body.tool} cannot be stored: their text {problem}")
            args = tool.validate_args(body.args)
        except (RoutingError, SchemaError) as exc:
            outcome = await self._record_rejection(command, command, exc)
            if outcome.new:
                await message.ack()
            elif await self._same_request(message, outcome.row, command):
                await self._tell_again(command.execution_id)
                await message.ack()
            return
        await self._accept(message, command, args, slot, safe=tool.binding.replay_policy == ReplayPolicy.SAFE)

    async def _accept(
        self, message: Delivery, command: ExecuteCommand, args: dict[str, Any], slot: Slot, safe: bool
    ) -> None:
        """``args``: the command's arguments as its tool validated them (its first run takes
        them so, instead of validating them again)."""
        body = command.body
        assert body is not None
        tasks, ex = self._tasks, self._executor
        execution_id = command.execution_id
        values = row_values(command, command, self.route, tasks.worker_id) | {
            "status": LedgerStatus.RUNNING if safe else LedgerStatus.ACCEPTED,
            "replay_policy": str(body.replay_policy),
            "args": body.args,
        }
        bodies: list[Any] = [AcceptedBody(worker=tasks.worker_id)]
        if not safe and may_have_been_pruned(execution_id, time.time(), self._ledger_horizon):
            # Absent from the ledger, but old enough that its row may have been pruned: it may
            # have run here already, so nothing is guessed (a person reconciles it).
            values["status"] = LedgerStatus.UNKNOWN
            bodies.append(UnknownBody(reason="the command is older than this pool's ledger keeps"))
        elif safe:
            values["attempts"] = 1
            bodies.append(StartedBody(attempt=1, worker=tasks.worker_id, reason="first_run"))
        # Reserved before the commit: from the commit on, the recovery scan would otherwise
        # see a row of this worker with no task here and start it too. If something here has
        # it already (another delivery of the same command), that one starts it.
        reserved = tasks.reserve(execution_id)
        # Asked now, while the accept commits: its cancel may wait on the control queue.
        controls = asyncio.ensure_future(self._first.caught_up())
        try:
            outcome = await self._insert(values, *bodies)
            if outcome.new:
                log.info("command_accepted", call_id=body.call_id, tool=body.tool, turn_id=body.turn_id)
                self._kill.hit("hands.after_accept_commit", body.call_id)
                if reserved and outcome.row.status in OPEN_STATUSES:
                    ex.launch(execution_id, partial(
                        ex.run, execution_id, row=outcome.row, trace=command.trace, args=args, after=controls,
                    ))  # fmt: skip
                    slot.handed_over = True
                # After the launch: the tool starts before the ack is framed and written (an ack
                # says the command is in the ledger, nothing about the tool; a lost one is a
                # duplicate).
                await self._ack(message)
                return
            if not await self._same_request(message, outcome.row, command):
                return
            await self._tell_again(execution_id)
            await self._ack(message)
            row = outcome.row
            if reserved and row.owner == tasks.worker_id and row.status in OPEN_STATUSES:
                # Our own accept landed although its commit looked failed (the message came
                # back): nothing here runs it, and no other worker would while we live.
                ex.launch(execution_id, partial(ex.adopt, execution_id))
                slot.handed_over = True
        finally:
            if reserved and not slot.handed_over:
                tasks.unreserve(execution_id)
            if not slot.handed_over:
                controls.cancel()

    async def surface_parked(self, conn: Connection, envelope: Any, reason: str) -> str | None:
        """A command parked for good that never made it into the ledger fails as rejected (so the
        Brain hears why, and a copy that comes later never runs); one that is in the ledger is
        being, or was, handled. Garbage (a digest that does not match) is only logged.

        A batch is parked when handling it failed as a whole (a worker that died on it, each time):
        its commands not in the ledger go back to the queue alone, each with its own delivery
        limit, so that only one that cannot be handled is parked, and the others run."""
        if isinstance(envelope, CommandBatch):
            return await self._batches.surface_parked(conn, envelope.commands, self._ledger)
        return await self._surface_command(conn, envelope, reason)

    async def _surface_command(self, conn: Connection, envelope: Any, reason: str) -> str | None:
        if not isinstance(envelope, ExecuteCommand) or unstorable_names(envelope) is not None:
            return None
        body = envelope.body
        if body is not None and request_digest(envelope.execution_id, body) != envelope.request_digest:
            return None
        ledger = self._ledger
        if await ledger.get(conn, envelope.execution_id) is not None:
            return None
        error = ParkedError(f"the command was parked before it could run: {reason}")
        values = row_values(
            envelope, envelope if body is not None else None, self.route, self._tasks.worker_id
        ) | {
            "status": LedgerStatus.FAILED,
            "error": error.as_dict(),
        }
        header = {k: values[k] for k in ("namespace", "session_id", "request_digest")}
        failed = FailedBody(error=error.as_dict(), how="rejected")
        events = await self._writer.events(envelope.execution_id, header, 1, failed)
        (row,) = await ledger.insert(conn, [NewExecution(values, events)])
        if row is None:
            return None
        # Sent once this commits (from the Brain's repair, if this worker dies first).
        self._relay.send(events)
        return f"execution {envelope.execution_id} failed as rejected: {error.message}"

    async def _tell_again(self, execution_id: str) -> None:
        """A command we already have came again: its sender (a Brain's stall repair, typically)
        may have missed every event, so all of them are sent again (the Brain drops the seqs it
        has). Without this, a Brain that lost even the ``accepted`` event would re-send the
        command forever and never hear back."""
        await self._relay.replay(execution_id, 1)

    async def _ack(self, message: Delivery) -> None:
        """Ack a delivery whose execution is in the ledger now, once the events pending went out
        (``EventRelay.ack``), or at once when no slot is free: the broker sends the next command
        only for an ack. A command of a batch is only marked: its batch's ack is the one sent."""
        if isinstance(message, Part):
            await message.ack()
        else:
            await self._relay.ack(message, hold=not self._tasks.slots.locked())

    async def _same_request(self, message: Delivery, row: Execution, command: ExecuteCommand) -> bool:
        """For an execution id already in the ledger: True for a duplicate (ack it), or
        dead-letter a conflicting command and return False."""
        if row.request_digest == command.request_digest:
            log.info("command_duplicate", status=row.status.value)
            return True
        conflict = ConflictError(
            f"execution {command.execution_id} is already in the ledger with request digest "
            f"{short(row.request_digest)}; this command has {short(command.request_digest)}"
        )
        await self._dead_letter(message, f"{conflict.code}: {conflict.message}")
        return False

    async def _record_rejection(
        self, header: ExecuteCommand, command: ExecuteCommand | None, exc: TendonError
    ) -> _Inserted:
        """Commit a FAILED row with a ``failed`` (how="rejected") event as its seq 1."""
        error = {"code": exc.code, "message": storable(exc.message)}  # it may quote the input
        values = row_values(header, command, self.route, self._tasks.worker_id) | {
            "status": LedgerStatus.FAILED,
            "error": error,
        }
        if command is not None and command.body is not None:
            args = command.body.args
            values |= {
                "replay_policy": str(command.body.replay_policy),
                "args": None if unstorable(args) else args,
            }
        outcome = await self._insert(values, FailedBody(error=error, how="rejected"))
        if outcome.new:
            log.warning("command_rejected", reason=exc.message)
        return outcome

    async def _insert(self, values: dict[str, Any], *bodies: Any) -> _Inserted:
        """Insert the row with its first events, or find the one already there."""
        ledger = self._ledger
        execution_id = values["execution_id"]
        self._tasks.fence()
        header = {k: values[k] for k in ("namespace", "session_id", "request_digest")}
        events = await self._writer.events(execution_id, header, 1, *bodies)
        row = await self._writer.insert(NewExecution(values, events))
        if row is not None:
            return _Inserted(row, new=True)
        existing = await ledger.read(lambda conn: ledger.get(conn, execution_id))
        assert existing is not None
        return _Inserted(existing, new=False)

    async def _dead_letter(self, message: Delivery, reason: str) -> None:
        await self._broker.dead_letter(self.queue, message, reason)
