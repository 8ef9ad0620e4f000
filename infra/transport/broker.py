"""RabbitMQ edges: the queue topology, a confirming publisher and consumers (aio-pika).

Every queue is a durable quorum queue with a delivery limit and its own dead-letter queue,
so a poison message ends up parked with a reason instead of looping. Publishing waits for
the broker's confirm; the outbox tables make a publish after a reconnect safe to repeat.
"""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

import aio_pika
import aiormq
import pamqp.commands
from aio_pika.abc import (
    AbstractChannel,
    AbstractQueue,
    AbstractRobustConnection,
)
from aio_pika.robust_channel import RobustChannel
from aiormq.exceptions import (
    AMQPConnectionError,
    ChannelInvalidStateError,
    ChannelLockedResource,
    ChannelNotFoundEntity,
    DeliveryError,
)
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
)

from infra.process.logging import get_logger
from infra.process.startup import wait_for
from infra.transport import REASON_HEADER, DeliveryHandler, Topology
from infra.transport.coalesce import CoalescingConnection
from infra.transport.quickack import DirectQueue, deliver

if TYPE_CHECKING:
    from infra.transport import Delivery

__all__ = ["Broker", "Topology"]

log = get_logger(__name__)

PERSISTENT = int(aio_pika.DeliveryMode.PERSISTENT)  # a message's delivery mode that survives a restart

# How long a consumer's set-up waits out a broker hiccup before the process gives up.
SETUP_PATIENCE = 30.0
NACK_PATIENCE = 10.0  # seconds a nacked publish is sent again before its error is the caller's


def _nacked(exc: BaseException) -> bool:
    return isinstance(exc, DeliveryError) and isinstance(exc.frame, pamqp.commands.Basic.Nack)


class Broker:
    """One connection, one confirming publish channel, and one channel per consumer."""

    def __init__(
        self, url: str, topology: Topology, *, delivery_limit: int = 5, patience: float = 30.0
    ) -> None:
        self.url = url
        self.topology = topology
        self.delivery_limit = delivery_limit
        self.patience = patience  # how long opening waits for RabbitMQ to answer
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractChannel | None = None
        self._declared: set[str] = set()
        self._consumer_channels: list[AbstractChannel] = []
        self._inspection: AbstractChannel | None = None  # for waiting(); see there

    async def __aenter__(self) -> Broker:
        # Reconnect a second after a lost connection, not aio-pika's default five.
        connect = partial(
            aio_pika.connect_robust, self.url, reconnect_interval=1, connection_class=CoalescingConnection
        )
        self._connection = await wait_for(connect, service="RabbitMQ", url=self.url, patience=self.patience)
        assert self._connection is not None
        self._channel = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        for ch in self._consumer_channels:
            if not ch.is_closed:
                await ch.close()
        if self._connection is not None:
            await self._connection.close()

    @property
    def connected(self) -> bool:
        """Whether the connection to RabbitMQ is up now (False while aio-pika reconnects)."""
        return self._connection is not None and self._connection.connected.is_set()

    @property
    def channel(self) -> AbstractChannel:
        if self._channel is None:
            raise RuntimeError("Broker used outside `async with`")
        return self._channel

    async def declare(self, queue: str, channel: AbstractChannel | None = None) -> AbstractQueue | None:
        """Declare ``queue`` (and its dead-letter queue) with the same arguments everywhere.

        A dead-letter queue itself (``Topology.dlq``) is declared as such: it has no limit and no
        dead-letter queue of its own (its consumer records what it reads, see ``infra.transport.parked``).
        """
        if queue in self._declared and channel is None:
            return None
        ch = channel or self.channel
        if Topology.is_dlq(queue):
            await self.declare(queue.removesuffix(".dlq"))  # which binds it to the exchange
            parked = await ch.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
            self._declared.add(queue)
            return parked
        dlx = await ch.declare_exchange(self.topology.dlx, aio_pika.ExchangeType.DIRECT, durable=True)
        dlq = await ch.declare_queue(
            self.topology.dlq(queue), durable=True, arguments={"x-queue-type": "quorum"}
        )
        await dlq.bind(dlx, routing_key=queue)
        declared = await ch.declare_queue(
            queue,
            durable=True,
            arguments={
                "x-queue-type": "quorum",
                "x-delivery-limit": self.delivery_limit,
                "x-dead-letter-exchange": self.topology.dlx,
                "x-dead-letter-routing-key": queue,
            },
        )
        self._declared.add(queue)
        return declared

    async def _declare_for_publish(self, queue: str) -> None:
        """Declare ``queue`` on the publishing channel the first time, shielded: aio-pika closes a
        channel whose call was cancelled, so a publisher stopped during a first declare (a relay at
        shutdown) left the channel closed for the flush that followed, and its last messages unsent.
        The check is ``declare``'s own, made here first: a shield starts a task, and every publish
        comes through here."""
        if queue not in self._declared:
            await asyncio.shield(self.declare(queue))

    async def publish(
        self, queue: str, body: bytes, *, message_id: str, headers: dict[str, Any] | None = None
    ) -> None:
        """Publish persistently and wait for the broker's confirm (raises if unroutable). A nack
        is sent again for a while: a quorum queue that another process declared a moment before
        nacks what comes while it starts (three pools starting at once, announcing their tools),
        and the message was not taken, so sending it again under its id sends nothing twice."""
        await self._declare_for_publish(queue)
        send = partial(self._send, queue, body, message_id, headers or {}, content_type="application/json")
        try:
            await send()  # the hot path: no retry machinery unless a nack comes
        except DeliveryError as exc:
            if not _nacked(exc):
                raise
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(_nacked),
                stop=stop_after_delay(NACK_PATIENCE),
                wait=wait_exponential(multiplier=0.05, max=1),
                reraise=True,
            ):
                with attempt:
                    await send()

    async def _send(
        self, routing_key: str, body: bytes, message_id: str | None, headers: dict[str, Any],
        content_type: str | None = None,
    ) -> None:  # fmt: skip
        """Publish persistently on the default exchange and wait for the confirm, through the
        aiormq channel under aio-pika's (opened to raise for an unroutable message, as a nack
        does). aio-pika's ``Message`` and exchange took 9 of the 10 us of making the message (more
        when the process just woke), and waiting for the frame to be written before waiting for
        its confirm was one more turn of the event loop."""
        if self.channel.is_closed:  # reopening after a lost connection: refused as aio-pika would
            raise ChannelInvalidStateError("the publishing channel is closed")
        channel = cast(aiormq.Channel, await self.channel.get_underlay_channel())  # it takes ``wait``
        properties = pamqp.commands.Basic.Properties(
            message_id=message_id, headers=headers, content_type=content_type, delivery_mode=PERSISTENT
        )
        await channel.basic_publish(
            body, routing_key=routing_key, properties=properties, mandatory=True, wait=False
        )

    async def publish_many(self, items: list[tuple[str, bytes, str]]) -> list[BaseException | None]:
        """Publish several messages with their confirms in flight together.

        Returns one entry per item: ``None`` when confirmed, else the exception.
        """
        if len(items) == 1:  # the usual case on a quiet path: no task to gather it in
            queue, body, message_id = items[0]
            try:
                await self.publish(queue, body, message_id=message_id)
            except Exception as exc:  # noqa: BLE001 - the caller's to handle, like gather's
                return [exc]
            return [None]
        results = await asyncio.gather(
            *(self.publish(q, body, message_id=mid) for q, body, mid in items),
            return_exceptions=True,
        )
        return [r if isinstance(r, BaseException) else None for r in results]

    async def dead_letter(self, queue: str, message: Delivery, reason: str) -> None:
        """Park ``message`` in ``queue``'s dead-letter queue with a readable reason, then ack it."""
        await self._declare_for_publish(queue)
        headers = {**(message.headers or {}), REASON_HEADER: reason[:1000]}
        await self._send(self.topology.dlq(queue), message.body, message.message_id, headers)
        await message.ack()
        log.warning("dead_lettered", queue=queue, message_id=message.message_id, reason=reason)

    async def park(self, queue: str, body: bytes, *, message_id: str, reason: str) -> None:
        """Publish ``body`` to ``queue``'s dead-letter queue with a readable reason."""
        await self.publish(
            self.topology.dlq(queue), body, message_id=message_id, headers={REASON_HEADER: reason[:1000]}
        )
        log.warning("parked", queue=queue, message_id=message_id, reason=reason)

    async def waiting(self, queue: str) -> int:
        """Messages ready in ``queue`` (RabbitMQ's ``message_count``: unacked ones not counted)."""
        return int((await self._inspect(queue)).message_count or 0)

    async def consumers(self, queue: str) -> int:
        """Consumers subscribed to ``queue`` right now, in any process."""
        return int((await self._inspect(queue)).consumer_count or 0)

    async def announce_presence(self, queue: str) -> None:
        """An exclusive queue of this connection: the broker deletes it when the connection
        closes, and the robust channel declares it again after a reconnect."""
        await self.channel.declare_queue(queue, exclusive=True, auto_delete=True)

    async def present(self, queue: str) -> bool:
        """Whether another connection holds the exclusive ``queue`` (a passive declare answers
        RESOURCE_LOCKED for it, NOT_FOUND once its connection closed)."""
        raw = await self._inspection_channel()
        try:
            await raw.queue_declare(queue, passive=True)
            return True
        except ChannelLockedResource:
            self._inspection = None  # the refused declare closed it
            return True
        except ChannelNotFoundEntity:
            self._inspection = None
            return False

    async def _inspection_channel(self) -> Any:
        assert self._connection is not None
        if self._inspection is None or self._inspection.is_closed:
            self._inspection = await self._connection.channel()
            self._consumer_channels.append(self._inspection)  # closed with the others
        return await self._inspection.get_underlay_channel()

    async def _inspect(self, queue: str) -> Any:
        """A passive declare of ``queue``: nothing is declared (so a process with other queue
        arguments, e.g. another delivery limit, can still look), and a queue that does not exist
        counts as empty and unserved.

        On the raw channel under a channel of its own: aio-pika's robust channel answers a
        passive declare of a known queue from its cache, and a failed declare closes the channel
        it ran on, which must never be the publishing one.
        """
        raw = await self._inspection_channel()
        try:
            ok = await raw.queue_declare(queue, passive=True)
        except ChannelNotFoundEntity:
            self._inspection = None  # the failed declare closed it
            return pamqp.commands.Queue.DeclareOk(queue, 0, 0)
        assert ok is not None
        return ok

    async def consume(self, queue: str, handler: DeliveryHandler, *, prefetch: int) -> AbstractChannel:
        """Start consuming ``queue`` on its own channel with ``prefetch`` unacked messages.

        Set-up is tried again (for up to ``SETUP_PATIENCE`` s) when the connection drops under
        it. RabbitMQ 3.10 does that on its own when a consumer subscribes to a quorum queue
        whose first declare is still starting the queue (another channel or process declared it
        a moment before): 541 INTERNAL_ERROR, the whole connection closed. aio-pika then
        reconnects; the consumer is set up on the new connection.
        """
        assert self._connection is not None
        connection = self._connection

        def hiccup(exc: BaseException) -> bool:
            lost = isinstance(exc, (AMQPConnectionError, ChannelInvalidStateError, ConnectionError))
            return lost or not connection.connected.is_set()

        async for attempt in AsyncRetrying(
            retry=retry_if_exception(hiccup),
            stop=stop_after_delay(SETUP_PATIENCE),
            wait=wait_exponential(multiplier=0.1, max=1),
            before_sleep=lambda state: log.warning(
                "consumer_setup_retry",
                queue=queue,
                error=repr(state.outcome.exception() if state.outcome else None),
            ),
            reraise=True,
        ):
            with attempt:
                await asyncio.wait_for(connection.connected.wait(), SETUP_PATIENCE)
                ch = await connection.channel()
                # Its queues hand their consumer aiormq's deliveries (``infra.transport.quickack``).
                cast(RobustChannel, ch).QUEUE_CLASS = DirectQueue
                try:
                    await ch.set_qos(prefetch_count=prefetch)
                    q = await self.declare(queue, channel=ch)
                    assert q is not None
                    await q.consume(partial(deliver, handler), no_ack=False)
                except BaseException:
                    with contextlib.suppress(Exception):
                        await ch.close()  # else the robust connection would restore it
                    raise
                self._consumer_channels.append(ch)
                return ch
        raise AssertionError("unreachable")  # pragma: no cover
