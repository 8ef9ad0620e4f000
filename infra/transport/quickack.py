"""Deliveries as ``infra.transport.Delivery``, straight from aiormq, with acks that do not wait.

aio-pika's own consumer wraps each delivery in an ``IncomingMessage`` (every property decoded)
and runs the callback in a task of its own, a second task per delivery: aiormq already runs each
delivery's callback in one. That was 66 to 79 us of a delivery's way to its handler, on every
command the Hands take and every update the Brain applies. ``DirectQueue`` hands aiormq's
delivery to the callback in aiormq's task; it registers its consumers as aio-pika's robust queue
does, so a reconnect restores them. aio-pika's recovery of a consumer the broker cancelled goes
its own way and hands the callback an ``IncomingMessage``: :func:`deliver` takes both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiormq
from aio_pika.abc import AbstractIncomingMessage, ConsumerTag, TimeoutType
from aio_pika.exceptions import ChannelInvalidStateError, MessageProcessError
from aio_pika.robust_queue import RobustQueue
from aiormq.abc import DeliveredMessage

from infra.transport import DeliveryHandler


class DirectQueue(RobustQueue):
    """A robust queue whose consumer callback gets aiormq's ``DeliveredMessage`` as it comes."""

    async def consume(  # type: ignore[override]
        self,
        callback: Callable[[Any], Any],
        no_ack: bool = False,
        exclusive: bool = False,
        arguments: dict[str, Any] | None = None,
        consumer_tag: ConsumerTag | None = None,
        timeout: TimeoutType = None,  # noqa: ASYNC109 - aio-pika's signature
        robust: bool = True,
    ) -> ConsumerTag:
        channel = await self.channel.get_underlay_channel()
        ok = await channel.basic_consume(
            queue=self.name, consumer_callback=callback, exclusive=exclusive, no_ack=no_ack,
            arguments=arguments, consumer_tag=consumer_tag, timeout=timeout,
        )  # fmt: skip
        if ok.consumer_tag is None:
            raise RuntimeError(f"the broker gave no consumer tag for {self.name}")
        if robust:  # what RobustQueue.restore consumes again after a reconnect
            self._consumers[ok.consumer_tag] = {
                "callback": callback, "no_ack": no_ack, "exclusive": exclusive, "arguments": arguments,
            }  # fmt: skip
        return ok.consumer_tag


async def deliver(handler: DeliveryHandler, message: DeliveredMessage | AbstractIncomingMessage) -> None:
    """A consumer callback: ``handler`` gets the delivery as a :class:`QuickAck`."""
    await handler(QuickAck(message))


class QuickAck:
    """A delivery (a ``Delivery``) whose ack is queued for the connection's writer and not waited
    for: what follows an ack (the Hands start the tool, the Brain a woken run) goes on at once
    instead of after two turns of the event loop. Waiting told nothing more: a written ack is not
    one the broker received, and an ack that is lost means a redelivery, which every consumer
    takes as the duplicate it is."""

    __slots__ = ("body", "message_id", "headers", "_tag", "_message", "_settled")

    def __init__(self, message: DeliveredMessage | AbstractIncomingMessage) -> None:
        if isinstance(message, DeliveredMessage):
            properties = message.header.properties
            self.message_id: str | None = properties.message_id
            self.headers: dict[str, Any] = properties.headers or {}
        else:
            self.message_id = message.message_id
            self.headers = message.headers
        self.body: bytes = message.body
        self._tag = message.delivery_tag
        self._message = message
        self._settled = False

    @property
    def processed(self) -> bool:
        return self._settled

    async def ack(self) -> None:
        channel, tag = self._unsettled()
        await channel.basic_ack(tag, wait=False)
        self._settled = True

    async def nack(self, *, requeue: bool = True) -> None:
        channel, tag = self._unsettled()
        await channel.basic_nack(tag, requeue=requeue)
        self._settled = True

    async def reject(self, *, requeue: bool = False) -> None:
        channel, tag = self._unsettled()
        await channel.basic_reject(tag, requeue=requeue)
        self._settled = True

    def _unsettled(self) -> tuple[aiormq.abc.AbstractChannel, int]:
        """The channel and tag to settle this delivery with: once only (twice would close the channel), and
        while it is open (an ``IncomingMessage``'s says so itself)."""
        if self._settled:
            raise MessageProcessError("Message already processed", self)  # type: ignore[arg-type]
        assert self._tag is not None, "consumed with acks, so every delivery has a tag"
        channel = self._message.channel
        if channel.is_closed:
            raise ChannelInvalidStateError("the channel this delivery came on is closed")
        return channel, self._tag
