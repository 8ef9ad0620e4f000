"""The control consumer: replay requests and cancels for this route's executions.

Controls have their own queue so that a backlog of commands never delays them. A control
that can never be carried out (malformed, unknown execution, wrong route) is dead-lettered
with a reason; anything else that goes wrong hands it back after a pause (``hands.delivery``).

- ``replay`` (from_seq): the Brain saw a gap. The events from ``from_seq`` on are made due
  again in the ledger and the relay republishes the stored bytes; no tool is re-run
  (invariant 7).
- ``cancel``: sets the durable ``cancel_requested`` flag and signals ``ctx.cancelled`` if the
  execution runs in this process. (Cancel receipts, tombstones for executions not seen yet and
  cancelling on other replicas are a later issue; this is the seam they plug into.)
"""

from __future__ import annotations

import asyncio

import asyncpg
from structlog.contextvars import bound_contextvars

from hands import ledger
from hands.delivery import hand_back
from hands.executor import Executor
from hands.relay import EventRelay
from infra.db import transact
from infra.logging import get_logger
from infra.payloads import PayloadCodec
from infra.transport import Delivery, Transport
from protocol import (
    CancelControl,
    NotFoundError,
    ReplayControl,
    RoutingError,
    TendonError,
    is_retryable,
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
        try:
            await self._handle(message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A passing fault (database, broker) or one we did not foresee: never leave the
            # message unacked; give it back after a pause, and let the delivery limit park it
            # if this keeps happening.
            if is_retryable(exc):
                log.warning("control_retry", error=f"{type(exc).__name__}: {exc}")
            else:
                log.exception("control_failed", error=f"{type(exc).__name__}: {exc}")
            await hand_back(message)

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
        async def work(conn: asyncpg.Connection) -> None:
            await self._owned_by_route(conn, control.execution_id)
            await ledger.request_cancel(conn, control.execution_id)

        await transact(self._pool, work)
        local = self._executor.cancel_local(control.execution_id)
        log.info("cancel_requested", running_here=local)
