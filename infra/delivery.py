"""Handing back a delivery that could not be processed, for both consumers of a pool.

An exception must never leave an aio-pika callback: the message would stay unacked on the
channel, neither processed nor redelivered, holding a prefetch slot until the channel closes.
So whatever goes wrong that is not the message's own fault (database, object store, broker
trouble, a bug), the consumer logs it and hands the message back with :func:`hand_back`.
"""

from __future__ import annotations

import asyncio

from infra.logging import get_logger
from infra.transport import Delivery

log = get_logger(__name__)

# How long to wait before handing a message back: redelivering it at once would burn its
# delivery limit within a second of a short outage. If it keeps failing, the limit parks it in
# the dead-letter queue, so a poison message cannot loop forever either.
RETRY_PAUSE = 1.0


async def hand_back(message: Delivery, pause: float = RETRY_PAUSE) -> None:
    """Requeue ``message`` after ``pause`` seconds (nack with requeue), unless already settled."""
    await asyncio.sleep(pause)
    if message.processed:
        return
    try:
        await message.nack(requeue=True)
    except Exception as exc:
        # The channel or connection is gone: the broker requeues its unacked deliveries itself.
        log.warning("nack_failed", message_id=message.message_id, error=f"{type(exc).__name__}: {exc}")
