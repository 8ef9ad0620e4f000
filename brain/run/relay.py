"""What the Brain publishes after a commit: the relays publish what the committing code hands them.

- :class:`CommandRelay` publishes the tool commands a commit of intents produced, from memory,
  with the broker's confirm: no read before publishing and no mark after. Commands for one route
  that are ready together travel as one message (a ``CommandBatch``). A command that never
  got out (the Brain died between its commit and its confirm, or the broker lost it) is still in
  its execution's row, INTENDED: the repair scan sends it again from there (``brain.run.scanner``),
  and the Hands take a duplicate for what it is (by execution id).
- :class:`ControlRelay` publishes cancels and an operator's reconciles. They are rare (a turn that
  ends with executions still open, an UNKNOWN execution resolved by hand) and must not be lost (a
  cancel that comes before its command leaves a tombstone), so each is an outbox row, committed
  with the change that made it and marked once confirmed; what a crash left unmarked is published
  again by the relay's periodic sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from brain.store import BrainStore, Control
from infra.process.logging import get_logger
from infra.process.loops import BackgroundLoop
from infra.transport import Transport
from protocol import command_batch_bytes, new_id

log = get_logger(__name__)

Message = tuple[str, bytes, str]  # queue, body, message id

# What one message of commands may carry: a batch goes to one Hands worker, which hands on what
# it has no free slot for (``hands.run.parts``); and a broker message is best kept small.
BATCH_COMMANDS = 32
BATCH_BYTES = 1024 * 1024


def bundled(
    commands: list[Message], *, most: int = BATCH_COMMANDS, max_bytes: int = BATCH_BYTES
) -> list[tuple[Message, list[Message]]]:
    """The messages that carry ``commands``, each with the commands it carries: the commands of
    one queue go together as a ``CommandBatch``, up to ``most`` of them and ``max_bytes``; a
    command with no company goes as it is."""
    by_queue: dict[str, list[list[Message]]] = {}
    size: dict[str, int] = {}  # bytes of each queue's last group
    for command in commands:
        queue, body = command[0], command[1]
        groups = by_queue.setdefault(queue, [[]])
        if groups[-1] and (len(groups[-1]) >= most or size[queue] + len(body) > max_bytes):
            groups.append([])
            size[queue] = 0
        groups[-1].append(command)
        size[queue] = size.get(queue, 0) + len(body)
    messages: list[tuple[Message, list[Message]]] = []
    for queue, groups in by_queue.items():
        for group in groups:
            if len(group) == 1:
                messages.append((group[0], group))
            else:
                message_id = new_id()
                body = command_batch_bytes([c[1] for c in group], message_id)
                messages.append(((queue, body, message_id), group))
    return messages


class CommandRelay:
    """Publishes handed-over commands; retries what the broker refused while this process lives."""

    def __init__(self, transport: Transport, *, retry_after: float = 0.5) -> None:
        self.transport = transport
        self.retry_after = retry_after
        self._pending: list[Message] = []
        self._wake = asyncio.Event()
        self.published = 0  # commands the broker confirmed
        self.messages = 0  # the messages that carried them

    def send(self, messages: Iterable[Message]) -> None:
        """Publish these soon (call after the commit that made them durable)."""
        self._pending.extend(messages)
        self._wake.set()

    async def run(self) -> None:
        # Not a BackgroundLoop: it has no period (only a hand-over wakes it), a refusal is an
        # answer rather than an error, and the pause after one is not cut short by a hand-over.
        while True:
            await self._wake.wait()
            self._wake.clear()
            refused = await self.publish_pending() < 0
            if refused:  # try again in a while (commands handed over meanwhile set the wake-up)
                await asyncio.sleep(self.retry_after)
                self._wake.set()

    async def publish_pending(self) -> int:
        """Publish what is pending: how many the broker confirmed, or -1 when it refused some
        (they stay pending)."""
        batch, self._pending = self._pending, []
        if not batch:
            return 0
        messages = bundled(batch)
        try:
            results = await self.transport.publish_many([message for message, _ in messages])
        except asyncio.CancelledError:
            # Stopped mid-publish (a Brain shutting down): the batch is pending again, for the
            # flush that follows (the Hands take a command that did get out twice as a duplicate).
            self._pending = batch + self._pending
            raise
        except Exception as exc:  # noqa: BLE001 - kept for the next round
            results = [exc] * len(messages)
        failed: list[Message] = []
        for ((queue, _, message_id), carried), err in zip(messages, results, strict=True):
            if err is not None:
                log.warning("command_publish_failed", queue=queue, message_id=message_id, error=repr(err))
                failed += carried
        self._pending = failed + self._pending
        self.published += len(batch) - len(failed)
        self.messages += sum(err is None for err in results)
        return -1 if failed else len(batch)

    async def flush(self, patience: float = 5.0) -> None:
        """Publish what is pending now (at shutdown); whatever is left the repair scan sends."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.publish_pending(), patience)


class ControlRelay:
    """Publishes controls from the outbox: at once when handed over, and by a periodic sweep."""

    def __init__(self, store: BrainStore, transport: Transport, *, interval: float) -> None:
        self.store = store
        self.transport = transport
        self.interval = interval
        self._handed: list[Control] = []
        # Each round, the first too, waits for a hand-over or the interval.
        self._loop = BackgroundLoop("control-relay", self._round, period=interval, first=interval)

    def send(self, controls: Iterable[Control]) -> None:
        """Publish these committed controls soon (call after their commit)."""
        self._handed.extend(controls)
        self._loop.wake()

    async def publish(self, controls: list[Control]) -> int:
        if not controls:
            return 0
        results = await self.transport.publish_many([(c.queue, c.payload, c.message_id) for c in controls])
        confirmed = [c.outbox_id for c, err in zip(controls, results, strict=True) if err is None]
        for c, err in zip(controls, results, strict=True):
            if err is not None:
                log.warning("control_publish_failed", queue=c.queue, error=repr(err))
        ids = [i for i in confirmed if i is not None]
        if ids:
            await self.store.transact(
                lambda conn: self.store.outbox.controls_published(conn, ids), single_statement=True
            )
        return len(confirmed)

    async def sweep(self) -> int:
        """Publish whatever a crash (or a refused publish) left unmarked."""
        controls = await self.store.read(self.store.outbox.unpublished_controls)
        return await self.publish(controls)

    async def _round(self) -> None:
        """What was handed over, else a sweep (a failed round leaves the rows to the next sweep)."""
        handed, self._handed = self._handed, []
        if handed:
            await self.publish(handed)
        else:
            await self.sweep()

    async def run(self) -> None:
        await self._loop.run()
