"""Consumers of what Hands send: sequenced execution events and tool binding announcements.

An update is acked only after its effect (or its place in the held-events buffer) is
committed. What can never be applied is parked in the dead-letter queue with a reason;
a payload that fails verification also fails its turn with a clear error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import asyncpg
from structlog.contextvars import bound_contextvars

from brain.sequencing import Arrival
from brain.states import TERMINAL_TURN
from brain.store import executions, repairs, turns
from infra.db import transact
from infra.delivery import handle_patiently
from infra.groupcommit import GroupCommit
from infra.killpoints import KillPoints
from infra.logging import get_logger
from infra.payloads import PayloadCodec
from infra.transport import Delivery, Transport
from protocol import (
    TERMINAL_EVENT_KINDS,
    BindingsAnnouncement,
    ObjectRefError,
    ParkedError,
    ProtocolError,
    TendonError,
    ToolBinding,
    decode,
)

log = get_logger(__name__)

EVENT_KINDS = TERMINAL_EVENT_KINDS | {"accepted", "started", "output_page", "unknown"}


class UpdateConsumer:
    def __init__(
        self,
        pool: asyncpg.Pool,
        broker: Transport,
        codec: PayloadCodec,
        killpoints: KillPoints,
        wake_channel: str,
        outbox_ready: Callable[[], None] = lambda: None,
    ) -> None:
        self.pool = pool
        self.broker = broker
        self.codec = codec
        self.killpoints = killpoints
        self.wake_channel = wake_channel
        self.outbox_ready = outbox_ready  # cancels of the executions of a turn it failed
        self.topology = broker.topology
        self.queue = broker.topology.updates
        # Events arriving together (a burst from one execution, or many executions under
        # load) are applied in one transaction, in (execution, seq) order.
        self.applier: GroupCommit[Any, Arrival] = GroupCommit(
            pool,
            lambda conn, event: executions.receive(conn, event, wake_channel),
            order=lambda event: (event.execution_id, event.seq),
            alone=executions.receive_alone,
        )

    async def handle(self, message: Delivery) -> None:
        """Apply one update; whatever happens, the message is acked, parked or requeued."""
        await handle_patiently(message, self._handle, what="an update")

    async def _handle(self, message: Delivery) -> None:
        try:
            header = decode(message.body)
        except ProtocolError as exc:
            await self.broker.dead_letter(self.queue, message, str(exc))
            return
        if header.kind not in EVENT_KINDS:
            await self.broker.dead_letter(self.queue, message, f"{header.kind} is not an execution event")
            return
        with bound_contextvars(execution_id=header.execution_id, seq=header.seq, kind=header.kind):
            self.killpoints.hit("brain.after_update_received", header.kind)
            try:
                event = await self.codec.resolve(header)
            except ObjectRefError as exc:
                error = {
                    "code": exc.code,
                    "message": f"update {header.kind} #{header.seq} of "
                    f"execution {header.execution_id} refused: {exc.message}",
                }
                if await transact(self.pool, lambda c: self._fail_turn_of(c, header, error)):
                    self.outbox_ready()
                await self.broker.dead_letter(self.queue, message, error["message"])
                return
            except TendonError as exc:
                if exc.retryable:
                    raise  # the object store is away: waited out (see handle)
                await self.broker.dead_letter(self.queue, message, str(exc))
                return
            try:
                arrival = await self.applier.submit(event)
            except TendonError as exc:
                if exc.retryable:
                    raise  # the database is away: waited out, the apply is idempotent
                await self.broker.dead_letter(self.queue, message, str(exc))
                return
            log.debug("update_received", arrival=str(arrival))
            await message.ack()

    async def _fail_turn_of(self, conn: asyncpg.Connection, header: Any, error: dict[str, str]) -> int:
        """Fail the turn of the execution an unverifiable update names, if the update's header
        is that execution's (scope and request digest): a message that merely names an
        execution id proves nothing, and is only parked. Returns the executions settled."""
        named = await repairs.named_by(conn, header)
        if named is None:
            return 0
        return await repairs.fail_turn(conn, named["turn_id"], error, self.wake_channel, self.topology)

    async def surface_parked(self, conn: asyncpg.Connection, envelope: Any, reason: str) -> str | None:
        """An update parked for good: its turn cannot go on past it, so it fails, saying why
        (unless the update was applied after all, or the turn ended already)."""
        if envelope.kind not in EVENT_KINDS:
            return None
        named = await repairs.named_by(conn, envelope)
        if named is None or envelope.seq <= named["last_seq"] or named["turn_status"] in TERMINAL_TURN:
            return None
        error = ParkedError(
            f"update {envelope.kind} #{envelope.seq} of execution {envelope.execution_id} could not be "
            f"applied and was parked: {reason}"
        )
        await repairs.fail_turn(conn, named["turn_id"], error.as_dict(), self.wake_channel, self.topology)
        self.outbox_ready()
        return f"turn {named['turn_id']} failed: {error.message}"


class BindingsConsumer:
    """Stores what Hands pools announce; the Brain never imports tool code."""

    def __init__(self, pool: asyncpg.Pool, broker: Transport, wake_channel: str) -> None:
        self.pool = pool
        self.broker = broker
        self.wake_channel = wake_channel
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
        bindings = announcement.body.bindings

        async def store(conn: asyncpg.Connection) -> None:
            for b in bindings:
                await conn.execute(
                    """INSERT INTO bindings (route, name, digest, binding) VALUES ($1, $2, $3, $4)
                       ON CONFLICT (route, name, digest) DO UPDATE SET announced_at = now()""",
                    b.route,
                    b.name,
                    b.digest,
                    b.model_dump(mode="json"),
                )
            await turns.wake_for_bindings(conn, self.wake_channel)

        await transact(self.pool, store)
        log.info("bindings_announced", route=announcement.body.route, tools=[b.name for b in bindings])
        await message.ack()


def _check_digest(binding: ToolBinding) -> None:
    fields: dict[str, Any] = binding.model_dump(exclude={"digest"})
    if ToolBinding.compute_digest(**fields) != binding.digest:
        raise ProtocolError(f"binding {binding.name} carries a digest that does not match its fields")
