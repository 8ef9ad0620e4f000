"""The base of the store's parts: each part holds the statements of one concern, runs them on the
connection its caller hands it (the caller owns the transaction), and reaches the other parts and
the backend's spellings through the store that composes them (``brain.store.BrainStore``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from brain.store import BrainStore


class Part:
    def __init__(self, store: BrainStore) -> None:
        self.store = store
