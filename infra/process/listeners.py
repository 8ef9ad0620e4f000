"""Listeners in this process, kept by key (a session, a turn) while they listen."""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterator
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V", bound=Hashable)


@contextlib.contextmanager
def listening(table: dict[K, set[V]], key: K, listener: V) -> Iterator[V]:
    """``listener`` is in ``table[key]`` for as long as the block runs; a key with no listener
    left is dropped, so the table holds only what someone listens to."""
    table.setdefault(key, set()).add(listener)
    try:
        yield listener
    finally:
        listeners = table.get(key, set())
        listeners.discard(listener)
        if not listeners:
            table.pop(key, None)
