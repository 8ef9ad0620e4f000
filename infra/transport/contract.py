"""What Brain and Hands need from a message transport, as structural types.

Two implementations satisfy these protocols: ``infra.transport.broker.Broker`` (RabbitMQ quorum queues,
the distributed mode) and ``infra.transport.localqueue.LocalBroker`` (a SQLite file, the embedded mode).
Code that consumes or publishes should be typed against these, never against aio-pika, so it
runs unchanged on both. The shared contract (tests/test_conformance_transport.py):

- FIFO per queue; at-least-once; ``publish`` returns only once the message is durable.
- A consumer holds at most ``prefetch`` unsettled deliveries at once.
- ``ack`` removes a message; ``nack``/``reject`` with ``requeue=True`` make it deliverable
  again; without requeue it goes to the queue's dead-letter queue (``Topology.dlq(queue)``).
- A message delivered more than ``delivery_limit`` times goes to the dead-letter queue.
- Deliveries still unsettled when their consumer closes (or its process dies) are delivered
  again; a settle after that raises.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, Self

__all__ = ["Consumer", "Delivery", "DeliveryHandler", "Topology", "Transport", "REASON_HEADER"]


@dataclass(frozen=True)
class Topology:
    """Queue names, all under one prefix so that tests and tenants do not collide."""

    prefix: str = "tendon"

    def commands(self, route: str) -> str:
        return f"{self.prefix}.{route}.commands"

    def controls(self, route: str) -> str:
        return f"{self.prefix}.{route}.controls"

    @property
    def updates(self) -> str:
        return f"{self.prefix}.updates"

    @property
    def bindings(self) -> str:
        return f"{self.prefix}.bindings"

    def presence(self, worker_id: str) -> str:
        """The queue a live process holds on its broker connection (``infra.liveness``)."""
        return f"{self.prefix}.presence.{worker_id}"

    @property
    def dlx(self) -> str:
        return f"{self.prefix}.dlx"

    @staticmethod
    def dlq(queue: str) -> str:
        return f"{queue}.dlq"

    @staticmethod
    def is_dlq(queue: str) -> bool:
        return queue.endswith(".dlq")


# Header carried by a message that ``dead_letter`` parked: why it was parked.
REASON_HEADER = "x-tendon-reason"


class Delivery(Protocol):
    """One delivered message; settle it exactly once with ack, nack or reject.

    ``aio_pika.abc.AbstractIncomingMessage`` satisfies this protocol as it is. ``requeue`` is
    keyword-only because aio-pika's ``nack`` takes ``multiple`` first.
    """

    @property
    def body(self) -> bytes: ...

    @property
    def message_id(self) -> str | None: ...

    @property
    def headers(self) -> dict[str, Any]: ...

    @property
    def processed(self) -> bool:
        """True once acked, nacked or rejected."""
        ...

    async def ack(self) -> None: ...

    async def nack(self, *, requeue: bool = True) -> None: ...

    async def reject(self, *, requeue: bool = False) -> None: ...


DeliveryHandler = Callable[[Delivery], Awaitable[None]]


class Consumer(Protocol):
    """A running subscription; closing it hands its unsettled deliveries back to the queue.

    An aio-pika channel (what ``Broker.consume`` returns) satisfies this protocol.
    """

    @property
    def is_closed(self) -> bool: ...

    def close(self) -> Awaitable[Any]: ...


class Transport(Protocol):
    """Durable queues with confirms, manual acks, a delivery limit and dead-letter queues."""

    @property
    def topology(self) -> Topology: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    @property
    def connected(self) -> bool:
        """Whether the transport is connected now (False while it reconnects)."""
        ...

    async def declare(self, queue: str) -> object:
        """Make sure ``queue`` and its dead-letter queue exist (idempotent)."""
        ...

    async def publish(
        self, queue: str, body: bytes, *, message_id: str, headers: dict[str, Any] | None = None
    ) -> None:
        """Return once the message is durable (the broker's confirm); raise otherwise."""
        ...

    async def publish_many(self, items: list[tuple[str, bytes, str]]) -> list[BaseException | None]:
        """Publish ``(queue, body, message_id)`` items; one entry per item, None if confirmed."""
        ...

    async def dead_letter(self, queue: str, message: Delivery, reason: str) -> None:
        """Copy ``message`` to ``queue``'s dead-letter queue with ``REASON_HEADER``, then ack it."""
        ...

    async def park(self, queue: str, body: bytes, *, message_id: str, reason: str) -> None:
        """Put ``body`` (a part of a delivery that can never be processed, e.g. one execution's
        events of a batch) in ``queue``'s dead-letter queue with ``REASON_HEADER``."""
        ...

    async def waiting(self, queue: str) -> int:
        """How many messages in ``queue`` wait for a consumer; handed-out, unsettled ones do not
        count. A hint for the moment it is read, never a basis for correctness."""
        ...

    async def consumers(self, queue: str) -> int:
        """How many consumers ``queue`` has right now (any process): whether anyone serves it.
        A hint for the moment it is read."""
        ...

    async def announce_presence(self, queue: str) -> None:
        """Hold ``queue`` for as long as this transport is connected: it disappears with the
        connection (a killed process), and comes back with a reconnect."""
        ...

    async def present(self, queue: str) -> bool:
        """Whether some connected transport holds ``queue`` (see ``announce_presence``)."""
        ...

    async def consume(self, queue: str, handler: DeliveryHandler, *, prefetch: int) -> Consumer:
        """Call ``handler`` for each delivery, with at most ``prefetch`` unsettled at once."""
        ...
