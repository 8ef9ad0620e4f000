"""Controls before commands: a command's body starts only once the controls that waited for its
route when the command came are handled, so that a cancel stops a command whichever of the two a
worker reads first (the cancel guarantee, docs/design.md).

A cancel and its command travel on two queues, and nothing orders their deliveries: a worker that
starts with both waiting (its pool was down), or that takes the command while the cancel still
waits (its controls' prefetch full, their handling held up by a database outage), may read the
command first. So each command's acceptance asks for a look at the control queue (the broker's
count of the messages ready there; one question answers every command that came before it was
sent), and its body starts once a look found nothing ready and every control this worker received
before that answer is handled. A cancel handled first left a tombstone (the command was a
duplicate, it never got this far) or set the execution's durable cancel flag, which the body's
start reads when anything had to be waited for.

What this cannot order is a cancel another worker of the pool is handling at the very moment
this one accepts the command (both received at once): that worker sets the flag a few
milliseconds later, and the body, if it started, is asked to stop (``ctx.cancelled``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from infra.process.logging import get_logger
from infra.transport import Delivery, Transport

log = get_logger(__name__)

# How long to wait before looking again at a control queue that still has messages ready: they
# are on their way to a consumer (this worker's or another's).
AGAIN = 0.02
# Between looks the broker did not answer (it is away, and so is every command it would bring).
PATIENCE = 1.0


@dataclass(frozen=True)
class _Look:
    ready: int  # messages ready in the control queue when the broker answered
    received: int  # controls this worker had received by then (numbered from 1)


class ControlsFirst:
    """The order of one worker's route: its control consumer's handling goes through
    :meth:`handled`, and a command's body waits for :meth:`caught_up`."""

    def __init__(self, transport: Transport, queue: str) -> None:
        self._transport = transport
        self._queue = queue
        self._received = 0
        self._open: dict[int, asyncio.Event] = {}  # controls received, not handled yet
        # One question to the broker at a time: the one on its way, and the next one, which every
        # caller that comes meanwhile shares (it is sent once the one on its way is answered).
        self._current: asyncio.Task[_Look] | None = None
        self._next: asyncio.Task[_Look] | None = None

    async def handled(self, message: Delivery, handle: Callable[[Delivery], Awaitable[None]]) -> None:
        """Handle a control delivery, known to the commands as received until it is settled."""
        self._received += 1
        number, done = self._received, asyncio.Event()
        self._open[number] = done
        try:
            await handle(message)
        finally:
            del self._open[number]
            done.set()

    async def caught_up(self) -> bool:
        """Return once the controls that waited when this was called are handled (by this
        worker, or delivered to another); whether there was anything to wait for (then the
        caller reads the execution's cancel flag again)."""
        waited = False
        while True:
            look = await self._look()
            if look.ready:
                waited = True
                await asyncio.sleep(AGAIN)
                continue
            before = [done for number, done in self._open.items() if number <= look.received]
            if not before:
                return waited
            await asyncio.gather(*(done.wait() for done in before))
            return True

    async def close(self) -> None:
        for task in (self._current, self._next):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _look(self) -> _Look:
        """A look whose question is sent after this call (one on its way was sent before)."""
        if self._next is None:
            self._next = asyncio.create_task(self._ask_after(self._current), name="controls-look")
        return await asyncio.shield(self._next)

    async def _ask_after(self, previous: asyncio.Task[_Look] | None) -> _Look:
        if previous is not None:
            await asyncio.wait([previous])
        self._current, self._next = self._next, None
        failures = 0
        while True:
            try:
                ready = await self._transport.waiting(self._queue)
            except Exception as exc:  # noqa: BLE001 - the broker is away: so are new commands
                failures += 1
                if failures % 10 == 1:
                    log.warning("control_queue_not_seen", queue=self._queue, attempts=failures,
                                error=repr(exc))  # fmt: skip
                await asyncio.sleep(min(PATIENCE, 0.05 * 2 ** min(failures, 5)))
                continue
            return _Look(ready, self._received)
