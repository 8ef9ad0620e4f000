"""One command of a ``CommandBatch`` message, handled as if it had come alone.

A batch is settled as a whole (one broker ack), yet each of its commands is deduplicated,
accepted, rejected or dead-lettered on its own, by the same code that handles a lone command
(and a passing fault is waited out per command). A :class:`Part` is the delivery that code
settles: acking it only marks it; dead-lettering it parks the command alone, as its own message,
and marks it; handing it back marks that the batch must come again. The batch message is acked
once every part is settled, and handed back if any part was (each of its commands is then a
duplicate or runs anew, by execution id, as for any redelivery).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from protocol import ExecuteCommand, encode


class Part:
    """A ``Delivery`` (``infra.transport``) of one command of a batch message."""

    def __init__(self, command: ExecuteCommand, headers: dict[str, Any] | None) -> None:
        self.command = command
        self.headers: dict[str, Any] = dict(headers or {})
        self.handed_back = False
        self.holds_slot = False  # a concurrency slot taken for it, not yet handed to its handling
        self._settled = False

    @cached_property
    def body(self) -> bytes:
        """The command as it would have come alone (needed only to park or pass it on)."""
        return encode(self.command)

    @property
    def message_id(self) -> str:
        return self.command.message_id

    @property
    def processed(self) -> bool:
        return self._settled

    async def ack(self) -> None:
        self._settled = True

    async def nack(self, *, requeue: bool = True) -> None:
        self._settled, self.handed_back = True, requeue

    async def reject(self, *, requeue: bool = False) -> None:
        self._settled, self.handed_back = True, requeue


def settle_as(parts: list[Part]) -> str:
    """What the batch message becomes once its parts are handled: ``ack`` when every part was
    settled for good, ``hand_back`` when one asked to come again, ``leave`` when some were not
    settled at all (the worker is stopping: its channel's close requeues the message)."""
    if not all(p.processed for p in parts):
        return "leave"
    return "hand_back" if any(p.handed_back for p in parts) else "ack"
