"""The control consumer: replay requests and cancels for this route's executions.

Controls have their own queue so that a backlog of commands never delays them. A control
that can never be carried out (malformed, unknown execution, wrong route) is dead-lettered
with a reason; a passing fault is waited out, and anything else that goes wrong hands it back
after a pause (``infra.delivery``).

- ``replay`` (from_seq): the Brain saw a gap. The events from ``from_seq`` on are made due
  again in the ledger and the relay republishes the stored bytes; no tool is re-run
  (invariant 7).
- ``cancel``: sets the durable ``cancel_requested`` flag and signals ``ctx.cancelled`` if the
  execution runs in this process; a body not started yet never starts (on any worker: the
  start is guarded by the flag). A cancel for an execution not in the ledger yet leaves a
  tombstone, a CANCELLED row with its ``cancelled`` event, so that the command, if it comes
  later, is a duplicate that never runs. (Receipts and reaching a body that runs on another
  replica are a later issue.)
"""

from __future__ import annotations

import asyncpg
from structlog.contextvars import bound_contextvars

from hands import ledger
from hands.executor import Executor
from hands.relay import EventRelay
from hands.states import LedgerStatus
from infra.db import transact
from infra.delivery import handle_patiently
from infra.logging import get_logger
from infra.payloads import PayloadCodec
from infra.transport import Delivery, Transport
from protocol import (
    CancelControl,
    CancelledBody,
    NotFoundError,
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
        pool: asyncpg.Pool,
        broker: Transport,
        codec: PayloadCodec,
        relay: EventRelay,
        executor: Executor,
    ) -> None:
        self.route = route
        self.queue = queue
        self._pool = pool
        self._broker = broker
        self._codec = codec
        self._relay = relay
        self._executor = executor

    async def handle(self, message: Delivery) -> None:
        """aio-pika callback: every delivery ends acked, dead-lettered or handed back."""
        await handle_patiently(message, self._handle, what="a control")

    async def _handle(self, message: Delivery) -> None:
        try:
            control = await self._codec.unpack(message.body)
            if not isinstance(control, ReplayControl | CancelControl):
                raise RoutingError(
                    f"expected a replay or cancel control on {self.queue}, got a {control.kind} envelope"
                )
            with bound_contextvars(execution_id=control.execution_id):
                if isinstance(control, ReplayControl):
                    await self._replay(control)
                else:
                    await self._cancel(control)
        except TendonError as exc:
            if exc.retryable:
                raise  # e.g. the database or object store is briefly away: handle() retries
            await self._broker.dead_letter(self.queue, message, f"{exc.code}: {exc.message}")
            return
        await message.ack()

    async def _owned_by_route(self, conn: asyncpg.Connection, execution_id: str) -> ledger.Execution:
        row = await ledger.get_execution(conn, execution_id)
        if row is None:
            raise NotFoundError(f"execution {execution_id} is not in the ledger of route {self.route}")
        if row.route != self.route:
            raise RoutingError(f"execution {execution_id} belongs to route {row.route}, not {self.route}")
        return row

    async def _replay(self, control: ReplayControl) -> None:
        assert control.body is not None
        from_seq = control.body.from_seq

        async def work(conn: asyncpg.Connection) -> int:
            await self._owned_by_route(conn, control.execution_id)
            return await ledger.republish_from(conn, control.execution_id, from_seq)

        count = await transact(self._pool, work)
        log.info("replay_requested", from_seq=from_seq, events=count)
        self._relay.wake(control.execution_id)

    async def _cancel(self, control: CancelControl) -> None:
        reason = control.body.reason if control.body is not None else ""

        async def work(conn: asyncpg.Connection) -> bool:
            row = await ledger.get_execution(conn, control.execution_id)
            if row is None:
                # The cancel came first: a tombstone, so that the command, if it still comes,
                # is a duplicate of a CANCELLED execution and never runs.
                values = {
                    "execution_id": control.execution_id,
                    "route": self.route,
                    "request_digest": control.request_digest,
                    "namespace": control.namespace,
                    "session_id": control.session_id,
                    "owner": self._executor.worker_id,
                    "status": LedgerStatus.CANCELLED,
                }
                body = CancelledBody(reason=f"cancelled before its command arrived: {reason}".rstrip(": "))
                if await ledger.insert_with_event(conn, self._codec, values, body) is not None:
                    return True
                row = await ledger.get_execution(conn, control.execution_id)  # the command won
                assert row is not None
            if row.route != self.route:
                raise RoutingError(
                    f"execution {control.execution_id} belongs to route {row.route}, not {self.route}"
                )
            await ledger.request_cancel(conn, control.execution_id)
            return False

        tombstone = await transact(self._pool, work)
        if tombstone:
            self._relay.wake(control.execution_id)
            log.info("cancel_before_command", reason=reason)
            return
        local = self._executor.cancel_local(control.execution_id)
        log.info("cancel_requested", running_here=local)
