"""Who waits, in this Brain process, for a turn to end: the API's ``GET /v1/turns/{id}?wait=``.

A turn that ends here (its last move committed, or it failed from outside a move) wakes its
waiters at once, so a client that submits and waits hears the answer as soon as it is committed,
with no request of its own in between. A turn that ends in another Brain wakes nobody here: the
waiter sees it at its next look at the turn's row (every ``Api.wait_poll`` seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from infra.process.listeners import listening


class Endings:
    """The waiters of each turn in this process; ``ended`` wakes them."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = {}

    @contextlib.contextmanager
    def watch(self, turn_id: str) -> Iterator[asyncio.Event]:
        """An event set when ``turn_id`` ends here, for as long as the block runs. Watch before
        the first look at the turn: an end between that look and the wait is not missed."""
        with listening(self._waiters, turn_id, asyncio.Event()) as event:
            yield event

    def waiting(self, turn_id: str) -> int:
        """How many wait for ``turn_id`` here now."""
        return len(self._waiters.get(turn_id, ()))

    def ended(self, turn_id: str) -> None:
        """``turn_id`` ended in a commit of this process (called once it committed)."""
        for event in self._waiters.get(turn_id, ()):
            event.set()


async def wake_or_timeout(event: asyncio.Event, seconds: float) -> None:
    """Wait until ``event`` is set or ``seconds`` passed, whichever comes first."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), max(0.0, seconds))
