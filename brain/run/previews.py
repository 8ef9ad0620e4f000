"""Live previews: the streamed pieces of a model reply in progress, for whoever watches its session.

They are never stored or replayed (the committed reply is the truth): a subscriber gets what is
streamed while it listens, in the Brain process that makes the model call, and a full queue drops
pieces rather than slowing the model down.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from brain.models import Delta, OnDelta
from infra.process.listeners import listening

QUEUE_SIZE = 1024


class Previews:
    """The subscribers of each session's previews in this Brain process."""

    def __init__(self) -> None:
        self._subscribers: dict[str, set[asyncio.Queue[tuple[str, Delta]]]] = {}

    def sink(self, session_id: str, turn_id: str) -> OnDelta | None:
        """Where a model call of ``turn_id`` sends its pieces (None: nobody listens)."""
        if not self._subscribers.get(session_id):
            return None

        def publish(delta: Delta) -> None:
            for queue in self._subscribers.get(session_id, ()):
                if not queue.full():
                    queue.put_nowait((turn_id, delta))

        return publish

    @contextmanager
    def subscribe(self, session_id: str) -> Iterator[asyncio.Queue[tuple[str, Delta]]]:
        """A queue of (turn id, piece) of the session's model calls for as long as the block runs."""
        queue: asyncio.Queue[tuple[str, Delta]] = asyncio.Queue(QUEUE_SIZE)
        with listening(self._subscribers, session_id, queue):
            yield queue
