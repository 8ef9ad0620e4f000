"""The control consumer: replay requests, cancels and reconciles for this route's executions.

Controls have their own queue so that a backlog of commands never delays them. A control
that can never be carried out (malformed, unknown execution, wrong route) is dead-lettered
with a reason; a passing fault is waited out, and anything else that goes wrong hands it back
after a pause (``infra.transport.delivery``).

- ``replay`` (from_seq): the Brain saw a gap, or heard nothing for a while. The events from
  ``from_seq`` on are read from the execution's row and published again as they were; no tool
  is re-run (invariant 7). A replay of an execution this pool never had is acked with a warning:
  there is nothing to send, and trying again would not change that.
- ``cancel``: sets the durable ``cancel_requested`` flag and signals ``ctx.cancelled`` if the
  execution runs in this process; a body not started yet never starts (on any worker: the
  start is guarded by the flag). A cancel for an execution not in the ledger yet leaves a
  tombstone, a CANCELLED row with its ``cancelled`` event, so that the command, if it comes
  later, is a duplicate that never runs. A command that a worker reads before its cancel waits
  for it: its body starts once the controls that waited when it came are handled
  (``hands.run.controls_first``).
- ``reconcile``: an operator's resolution of an UNKNOWN execution, sent by a Brain for a request
  to its HTTP API. It is carried out here as ``hands reconcile`` does it
  (``hands.run.reconcile``: the audit row, the status move and the event in one transaction,
  then the event published; what could not be is published by the relay's sweep). The same
  request again (a repeated request, a redelivery) is a duplicate: acked, nothing new published.
  A reconcile of an execution that is not UNKNOWN here (reconciled first by another request or
  by ``hands reconcile``) is acked with a warning: trying again would never change the answer.
- ``input``: a person's answer to what a running execution asked (its ``input_required``), sent
  by a Brain for `brain respond`. It is kept in the execution's row (``Ledger.give_input``), where
  the worker following it reads it (``ctx.given_input``), whichever worker that is and whenever it
  looks; the first answer to a question stands, a repeat is acked as a duplicate.

An answer or a cancel for a parked execution (``hands.tools.declare.Park``: an MCP task that
waits for a person, or runs long, followed by no worker) makes it due in the same commit; the
recovery scan of whichever worker looks first takes it up (this worker's is told to look now).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from structlog.contextvars import bound_contextvars

from hands.rules.states import LedgerStatus
from hands.run.controls_first import ControlsFirst
from hands.run.reconcile import publish, reconcile
from hands.run.relay import EventRelay
from hands.run.tasks import Tasks
from hands.run.writer import LedgerWriter
from hands.store import Execution, Ledger, NewExecution
from infra.db import Connection
from infra.objects.payloads import PayloadCodec
from infra.process.logging import get_logger
from infra.transport import Delivery, Transport
from infra.transport.delivery import handle_patiently
from protocol import (
    CancelControl,
    CancelledBody,
    ConflictError,
    IllegalTransitionError,
    InputControl,
    NotFoundError,
    ReconcileControl,
    ReplayControl,
    RoutingError,
    TendonError,
)

log = get_logger(__name__)


class ControlConsumer:
    """Handles deliveries from ``<prefix>.<route>.controls``."""

    def __init__(
        self,
        *,
        route: str,
        queue: str,
        broker: Transport,
        codec: PayloadCodec,
        relay: EventRelay,
        ledger: Ledger,
        writer: LedgerWriter,
        tasks: Tasks,
        first: ControlsFirst,
        wake: Callable[[], None] | None = None,
    ) -> None:
        self.route = route
        # A parked execution an answer or a cancel made due is taken up by the next recovery scan
        # of any worker (the row says so); this one's scan is told to look now.
        self._wake = wake or (lambda: None)
        self.queue = queue
        self._first = first  # the commands' bodies wait for what it receives to be handled
        self._ledger = ledger
        self._writer = writer
        self._broker = broker
        self._codec = codec
        self._relay = relay
        self._tasks = tasks

    async def handle(self, message: Delivery) -> None:
        """aio-pika callback: every delivery ends acked, dead-lettered or handed back."""
        await self._first.handled(message, partial(handle_patiently, handle=self._handle, what="a control"))

    async def _handle(self, message: Delivery) -> None:
        try:
            control = await self._codec.unpack(message.body)
            if not isinstance(control, ReplayControl | CancelControl | ReconcileControl | InputControl):
                raise RoutingError(
                    f"expected a replay, cancel, reconcile or input control on {self.queue}, "
                    f"got a {control.kind} envelope"
                )
            with bound_contextvars(execution_id=control.execution_id):
                if isinstance(control, ReplayControl):
                    await self._replay(control)
                elif isinstance(control, ReconcileControl):
                    await self._reconcile(control)
                elif isinstance(control, InputControl):
                    await self._input(control)
                else:
                    await self._cancel(control)
        except TendonError as exc:
            if exc.retryable:
                raise  # e.g. the database or object store is briefly away: handle() retries
            await self._broker.dead_letter(self.queue, message, f"{exc.code}: {exc.message}")
            return
        await message.ack()

    def _of_route(self, row: Execution | None, execution_id: str) -> Execution:
        if row is None:
            raise NotFoundError(f"execution {execution_id} is not in the ledger of route {self.route}")
        if row.route != self.route:
            raise RoutingError(f"execution {execution_id} belongs to route {row.route}, not {self.route}")
        return row

    async def _replay(self, control: ReplayControl) -> None:
        assert control.body is not None
        row = await self._ledger.read(lambda conn: self._ledger.get(conn, control.execution_id))
        if row is None:
            # Nothing to send: its command never reached this pool (it waits in its queue, or it
            # went elsewhere). Not poison: trying again would not change that, and parking it would
            # list as broken a question that has no answer here. The Brain counts the silence and,
            # after its repair attempts, fails the turn naming this route.
            log.warning(
                "replay_of_an_execution_not_here", from_seq=control.body.from_seq,
                reason=f"route {self.route} has no execution {control.execution_id} in its ledger",
            )  # fmt: skip
            return
        self._of_route(row, control.execution_id)
        count = await self._relay.replay(control.execution_id, control.body.from_seq)
        log.info("replay_requested", from_seq=control.body.from_seq, events=count)

    async def _reconcile(self, control: ReconcileControl) -> None:
        body = control.body
        assert body is not None
        row = self._of_route(
            await self._ledger.read(lambda conn: self._ledger.get(conn, control.execution_id)),
            control.execution_id,
        )
        if (row.namespace, row.session_id, row.request_digest) != (
            control.namespace, control.session_id, control.request_digest,
        ):  # fmt: skip
            raise ConflictError(f"reconcile of execution {control.execution_id} names another command")
        outcome: dict[str, Any] = {"result": body.result} if body.succeeded else {"failure": body.failure}
        with bound_contextvars(request_id=body.request_id, actor=body.actor):
            try:
                done = await reconcile(
                    self._ledger, self._codec, control.execution_id, evidence=body.evidence,
                    actor=body.actor, request_id=body.request_id, **outcome,
                )  # fmt: skip
            except IllegalTransitionError as exc:
                log.warning("reconcile_refused", reason=exc.message)
                return
            if done.duplicate:
                log.info("reconcile_duplicate", audit_id=done.audit_id)
                return
            try:
                await publish(self._ledger, self._broker, done)
            except Exception as exc:  # noqa: BLE001 - committed: the relay's sweep publishes it
                log.warning("reconcile_event_not_published", audit_id=done.audit_id, error=repr(exc))
            log.info("reconciled", audit_id=done.audit_id, status=done.execution.status.value, seq=done.seq)

    async def _input(self, control: InputControl) -> None:
        body = control.body
        assert body is not None
        answer = {"decision": body.decision, "answer": body.answer, "reason": body.reason,
                  "request_id": body.request_id}  # fmt: skip

        async def work(conn: Connection) -> bool:
            row = self._of_route(await self._ledger.get(conn, control.execution_id), control.execution_id)
            if row.request_digest != control.request_digest:
                raise ConflictError(f"input for execution {control.execution_id} names another command")
            return await self._ledger.give_input(conn, control.execution_id, body.key, answer)

        kept = await self._ledger.transact(work)
        log.info("input_given" if kept else "input_not_kept", key=body.key, decision=body.decision)
        if kept:
            self._wake()

    async def _cancel(self, control: CancelControl) -> None:
        reason = control.body.reason if control.body is not None else ""
        header = {"namespace": control.namespace, "session_id": control.session_id,
                  "request_digest": control.request_digest}  # fmt: skip
        body = CancelledBody(reason=f"cancelled before its command arrived: {reason}".rstrip(": "))
        tombstone = await self._writer.events(control.execution_id, header, 1, body)

        async def work(conn: Connection) -> bool:
            row = await self._ledger.get(conn, control.execution_id)
            if row is None:
                # The cancel came first: a tombstone, so that the command, if it still comes, is a
                # duplicate of a CANCELLED execution and never runs.
                values = {
                    "execution_id": control.execution_id,
                    "route": self.route,
                    **header,
                    "owner": self._tasks.worker_id,
                    "status": LedgerStatus.CANCELLED,
                }
                (inserted,) = await self._ledger.insert(conn, [NewExecution(values, tombstone)])
                if inserted is not None:
                    return True
                row = await self._ledger.get(conn, control.execution_id)  # the command won
            self._of_route(row, control.execution_id)
            await self._ledger.request_cancel(conn, control.execution_id)
            return False

        if await self._ledger.transact(work):
            self._relay.send(tombstone)
            log.info("cancel_before_command", reason=reason)
            return
        local = self._tasks.cancel_local(control.execution_id)
        log.info("cancel_requested", running_here=local)
        if not local:
            self._wake()
