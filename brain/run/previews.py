"""Live previews: the streamed pieces of a model reply in progress, for whoever watches its session.

They are never stored or replayed (the committed reply is the truth): a subscriber gets what is
streamed while it listens, in the Brain process that makes the model call, and a full queue drops
pieces rather than slowing the model down.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from brain.models import Delta, OnDelta
from infra.process.listeners import listening

QUEUE_SIZE = 1024


class Piece(NamedTuple):
    """A streamed piece, with the message it is part of: its logical id and which attempt of its
    model call streams it (``brain.rules.messages``), so that a watcher that saw the pieces of an
    attempt that was then superseded knows which text the next attempt replaces."""

    turn_id: str
    message_id: str
    attempt: int
    delta: Delta

    def as_dict(self) -> dict[str, object]:
        return {"turn_id": self.turn_id, "message_id": self.message_id, "attempt": self.attempt,
                **self.delta.model_dump(exclude_none=True)}  # fmt: skip


class Previews:
    """The subscribers of each session's previews in this Brain process."""

    def __init__(self) -> None:
        self._subscribers: dict[str, set[asyncio.Queue[Piece]]] = {}

    def sink(self, session_id: str, turn_id: str, message_id: str, attempt: int) -> OnDelta | None:
        """Where attempt ``attempt`` of the model call of ``turn_id`` that makes ``message_id``
        sends its pieces (None: nobody listens)."""
        if not self._subscribers.get(session_id):
            return None

        def publish(delta: Delta) -> None:
            piece = Piece(turn_id, message_id, attempt, delta)
            for queue in self._subscribers.get(session_id, ()):
                if not queue.full():
                    queue.put_nowait(piece)

        return publish

    @contextmanager
    def subscribe(self, session_id: str) -> Iterator[asyncio.Queue[Piece]]:
        """A queue of the pieces of the session's model calls for as long as the block runs."""
        queue: asyncio.Queue[Piece] = asyncio.Queue(QUEUE_SIZE)
        with listening(self._subscribers, session_id, queue):
            yield queue
