"""Acks that do not wait: deliveries of aio-pika consumers as ``infra.transport.Delivery``."""

from __future__ import annotations

from typing import Any

from aio_pika.abc import AbstractIncomingMessage
from aio_pika.exceptions import MessageProcessError

from infra.transport import DeliveryHandler


async def deliver(handler: DeliveryHandler, message: AbstractIncomingMessage) -> None:
    """aio-pika's consumer callback: ``handler`` gets the delivery as a :class:`QuickAck`."""
    await handler(QuickAck(message))


class QuickAck:
    """An aio-pika delivery (a ``Delivery``) whose ack is queued for the connection's writer and
    not waited for: what follows an ack (the Hands start the tool, the Brain a woken run) goes on
    at once instead of after two turns of the event loop. Waiting told nothing more: a written
    ack is not one the broker received, and an ack that is lost means a redelivery, which every
    consumer takes as the duplicate it is."""

    __slots__ = ("_message", "_acked")

    def __init__(self, message: AbstractIncomingMessage) -> None:
        self._message = message
        self._acked = False

    @property
    def body(self) -> bytes:
        return self._message.body

    @property
    def message_id(self) -> str | None:
        return self._message.message_id

    @property
    def headers(self) -> dict[str, Any]:
        return self._message.headers

    @property
    def processed(self) -> bool:
        return self._acked or self._message.processed

    async def ack(self) -> None:
        self._unsettled()
        tag = self._message.delivery_tag
        assert tag is not None, "consumed with acks, so every delivery has a tag"
        await self._message.channel.basic_ack(tag, wait=False)
        self._acked = True

    async def nack(self, *, requeue: bool = True) -> None:
        self._unsettled()
        await self._message.nack(requeue=requeue)

    async def reject(self, *, requeue: bool = False) -> None:
        self._unsettled()
        await self._message.reject(requeue=requeue)

    def _unsettled(self) -> None:
        if self.processed:  # settling a delivery twice would close its channel
            raise MessageProcessError("Message already processed", self._message)
