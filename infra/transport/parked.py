"""Parked messages: whatever a dead-letter queue holds is read, recorded and surfaced.

A message lands in a queue's dead-letter queue when it can never be processed as it is: not
decodable, a conflict, a reference that fails verification, or delivered more times than the
delivery limit allows (a message that broke its consumer again and again). Each component
consumes the dead-letter queues of the queues it consumes (the Brain: updates and bindings; a
Hands pool: its route's commands and controls), so that nothing parked goes unnoticed:

- it is surfaced where it belongs: an error on the turn or execution it names, which the
  component decides (its ``Surface``); a message that names nothing is logged with its reason;
- it is recorded in the ``parked`` table of the component's schema (reason, headers, bytes and
  what was done about it), for ``brain parked`` and ``hands parked`` to list and show.

Each schema that uses this has the ``parked`` table (created by the component's migrations), and
each component's store includes ``infra.db.parked.ParkedRows``, the statements on it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from infra.db import Connection, is_transient, patiently
from infra.process.logging import get_logger
from infra.transport import REASON_HEADER, Delivery, Topology, Transport
from protocol import ProtocolError, TendonError, decode
from protocol.storable import storable

log = get_logger(__name__)

# What a component does about a parked message that it could decode, in the caller's
# transaction; returns what it did (one sentence), or None when it had nothing to do.
Surface = Callable[[Any, Any, str], Awaitable[str | None]]

_DEATHS = {
    "delivery_limit": "delivered more times than the delivery limit allows without being settled",
    "rejected": "rejected by its consumer",
    "expired": "expired in its queue",
    "maxlen": "dropped by a full queue",
}


def reason_of(headers: dict[str, Any] | None) -> str:
    """Why a message was parked, from its headers: Tendon's own reason, or the broker's."""
    headers = {
        k: v.decode(errors="replace") if isinstance(v, bytes) else v for k, v in (headers or {}).items()
    }
    if headers.get(REASON_HEADER):
        return str(headers[REASON_HEADER])
    death = str(headers.get("x-first-death-reason") or "")
    if death:
        where = headers.get("x-first-death-queue")
        return _DEATHS.get(death, death) + (f" (queue {where})" if where else "")
    return "no reason given"


class ParkedConsumer:
    """Consumes the dead-letter queue of ``queue``: surfaces and records each message."""

    def __init__(self, store: Any, transport: Transport, queue: str, surface: Surface | None = None) -> None:
        self.store = store  # a component's store: it has ParkedRows
        self.transport = transport
        self.queue = queue
        self.dlq = Topology.dlq(queue)
        self._surface = surface

    async def start(self, *, prefetch: int = 4) -> Any:
        return await self.transport.consume(self.dlq, self.handle, prefetch=prefetch)

    async def handle(self, message: Delivery) -> None:
        """Never raises and never hands the message back (a dead-letter queue has no limit
        that would park it again): a fault that does not pass is logged, and it is dropped."""
        reason = reason_of(message.headers)
        try:
            envelope = decode(message.body)
        except ProtocolError:
            envelope = None
        try:
            surfaced = await patiently(lambda: self._surfaced(envelope, reason), what="a parked message")
            await patiently(
                lambda: self.store.transact(lambda c: self._record(c, message, reason, envelope, surfaced)),
                what="a parked message",
            )
        except Exception:
            log.exception("parked_message_not_recorded", queue=self.queue, reason=reason)
        else:
            log.warning(
                "message_parked",
                queue=self.queue,
                message_id=message.message_id,
                kind=getattr(envelope, "kind", None),
                execution_id=getattr(envelope, "execution_id", None),
                reason=reason,
                surfaced=surfaced,
            )
        try:
            await message.ack()
        except Exception as exc:  # noqa: BLE001 - then it comes again, and is recorded again
            log.warning("parked_ack_failed", queue=self.queue, error=repr(exc))

    async def _surfaced(self, envelope: Any, reason: str) -> str:
        if envelope is None or self._surface is None:
            return "logged: it names nothing that can be told"
        surface = self._surface
        try:
            done = await self.store.transact(lambda conn: surface(conn, envelope, reason))
        except Exception as exc:
            if is_transient(exc):
                raise
            detail = exc.message if isinstance(exc, TendonError) else f"{type(exc).__name__}: {exc}"
            return storable(f"logged: telling {getattr(envelope, 'execution_id', '?')} failed: {detail}")
        return done or "logged: nothing was left to tell"

    async def _record(
        self, conn: Connection, message: Delivery, reason: str, envelope: Any, surfaced: str
    ) -> None:
        headers = {storable(str(k)): storable(str(v)) for k, v in (message.headers or {}).items()}
        named = getattr(envelope, "execution_id", None) or _first_execution(envelope)
        await self.store.record_parked(
            conn,
            queue=self.queue,
            message_id=storable(message.message_id) if message.message_id else None,
            reason=storable(reason),
            headers=headers,
            body=bytes(message.body),
            kind=getattr(envelope, "kind", None),
            execution_id=storable(named) if named else None,
            surfaced=surfaced,
        )


def _first_execution(envelope: Any) -> str | None:
    """The execution a batch of events or commands names first (a parked batch is listed under
    it)."""
    carried = getattr(envelope, "events", None) or getattr(envelope, "commands", None)
    return carried[0].execution_id if carried else None
