"""Settling a delivery whatever happens, for every consumer of Brain and Hands.

An exception must never leave a consumer's callback: the message would stay unacked on the
channel, neither processed nor redelivered, holding a prefetch slot until the channel closes.
And a passing fault must not burn the message's delivery limit: a database restart of a few
seconds would otherwise park every message that arrived meanwhile. So :func:`handle_patiently`
waits a passing fault out in place, the message unacked (no redelivery counts), and hands it
back after a pause only for anything else: a bug, or an outage longer than the patience. If
that keeps happening, the delivery limit parks it in the dead-letter queue, so a poison
message cannot loop forever either.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from infra.db import patiently
from infra.process.logging import get_logger
from infra.transport import Delivery
from protocol import is_retryable

log = get_logger(__name__)

# How long to wait before handing a message back: redelivering it at once would burn its
# delivery limit within a second.
RETRY_PAUSE = 1.0


async def handle_patiently(
    message: Delivery, handle: Callable[[Delivery], Awaitable[None]], *, what: str
) -> None:
    """Run ``handle(message)`` (which settles it), waiting out passing faults; never raises
    but for cancellation. ``handle`` must be safe to run again after a passing fault."""

    async def attempt() -> None:
        if not message.processed:  # settled by an attempt that failed afterwards
            await handle(message)

    try:
        await patiently(attempt, what=what, message_id=message.message_id)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if is_retryable(exc):
            log.warning("handed_back", handling=what, error=f"{type(exc).__name__}: {exc}")
        else:
            log.exception("handling_failed", handling=what, error=f"{type(exc).__name__}: {exc}")
        await hand_back(message)


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
