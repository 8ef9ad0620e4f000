"""Command batches: each command of a ``CommandBatch`` message handled as if it had come alone.

A batch is settled as a whole (one broker ack), yet each of its commands is deduplicated,
accepted, rejected or dead-lettered on its own, by the same code that handles a lone command
(and a passing fault is waited out per command). A :class:`Part` is the delivery that code
settles: acking it only marks it; dead-lettering it parks the command alone, as its own message,
and marks it; handing it back (or rejecting it) marks that it must come again, which it does
alone, as a message of its own. The batch message is acked once every part is settled; a batch
that comes again (a worker died before its ack) is each of its handled commands a duplicate, by
execution id, as for any redelivery.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import cached_property
from typing import Any

from hands.rules.commands import unstorable_names
from infra.db import Connection
from infra.process.killpoints import KillPoints
from infra.process.logging import get_logger
from infra.transport import Delivery, Transport
from infra.transport.delivery import hand_back, handle_patiently
from protocol import ExecuteCommand, encode

log = get_logger(__name__)


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
        # Never dropped with the batch, whatever ``requeue`` says: it comes again, alone, where
        # the broker's own rules (the delivery limit, the dead-letter queue) apply to it.
        self._settled, self.handed_back = True, True

    async def reject(self, *, requeue: bool = False) -> None:
        await self.nack(requeue=requeue)


class Batches:
    """Handles the ``CommandBatch`` deliveries of a command consumer: ``handle_one(part,
    command)`` is the consumer's own handling of one command, given the slot taken for it."""

    def __init__(
        self,
        *,
        queue: str,
        broker: Transport,
        slots: asyncio.Semaphore,
        handle_one: Callable[[Delivery, ExecuteCommand], Awaitable[None]],
        kill: KillPoints,
        ack: Callable[[Delivery], Awaitable[None]],
    ) -> None:
        self.queue = queue
        self._broker = broker
        self._slots = slots
        self._handle_one = handle_one
        self._kill = kill
        self._ack = ack

    async def handle(self, message: Delivery, commands: list[ExecuteCommand]) -> None:
        """Each command of a batch as if it had come alone, a passing fault waited out per
        command. The first waits for a slot, as a lone command does; each of the others takes a
        slot that is free now, or goes back to the queue alone for a worker that has one: a batch
        never holds work here that another worker could start at once. A command that asks to
        come again goes back alone too, so that the batch is acked and a poison command meets the
        delivery limit by itself."""
        parts = [Part(command, message.headers) for command in commands]
        handling = []
        try:
            for i, part in enumerate(parts):
                if i and self._slots.locked() and await self._pass_on(part):
                    continue
                await self._slots.acquire()
                part.holds_slot = True
                handling.append(asyncio.create_task(handle_patiently(part, self._attempt, what="a command")))
            await asyncio.gather(*handling)
        except asyncio.CancelledError:
            for part in parts:  # cancelled before its handling began: its slot is given back here
                if part.holds_slot:
                    part.holds_slot = False
                    self._slots.release()
            raise
        if not all(part.processed for part in parts):
            return  # stopping: the channel's close requeues the message
        for part in parts:
            if part.handed_back and not await self._pass_on(part):
                await hand_back(message, pause=0.0)  # the broker is away: the batch comes again
                return
        first = commands[0].body
        self._kill.hit("hands.before_batch_ack", first.call_id if first else None)
        await self._ack(message)

    async def _attempt(self, part: Delivery) -> None:
        """One attempt at a part: the first has the slot its batch took for it, a later one
        (after a passing fault gave that back) takes one of its own."""
        assert isinstance(part, Part)
        if part.holds_slot:
            part.holds_slot = False
        else:
            await self._slots.acquire()
        await self._handle_one(part, part.command)

    async def _pass_on(self, part: Part) -> bool:
        """Publish a part back to the queue as a message of its own; False if the broker refused."""
        try:
            await self._broker.publish(self.queue, part.body, message_id=part.message_id)
        except Exception as exc:  # noqa: BLE001 - the caller handles the part another way
            log.warning("command_not_passed_on", execution_id=part.command.execution_id, error=repr(exc))
            return False
        await part.ack()
        return True

    async def surface_parked(
        self, conn: Connection, commands: list[ExecuteCommand], ledger: Any
    ) -> str | None:
        """A batch is parked when handling it failed as a whole (a worker that died on it, each
        time): its commands not in the ledger go back to the queue alone, each with its own
        delivery limit, so that only one that cannot be handled is parked and the others run."""
        again = []
        for command in commands:
            if unstorable_names(command) is not None or await ledger.get(conn, command.execution_id) is None:
                again.append(command)
        for command in again:
            await self._broker.publish(self.queue, encode(command), message_id=command.message_id)
        return f"{len(again)} of its {len(commands)} commands sent again alone" if again else None
