"""Retention: pruning what is finished after its horizon, and the one rule that keeps pruning
from ever letting a side effect run twice.

Each process prunes its own store: a Brain the journal of long-closed sessions and its parked
messages, a Hands pool its finished executions (with their output) and its parked messages.
What each prune may touch is the store's rule (``brain.store.retention``,
``hands.store.retention``, ``infra.db.parked``); this module only runs them: at start and then
every so often, in small transactions so that no prune holds locks that turns wait on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from infra.process.logging import get_logger
from infra.process.loops import BackgroundLoop
from protocol import id_time

log = get_logger(__name__)

DAY = 86400.0
BATCH = 500  # rows per transaction
MARGIN = 0.1  # of the ledger horizon, kept for clocks that disagree


@dataclass(frozen=True)
class Horizon:
    """One kind of record, how long it is kept (seconds; 0: forever), and how it is pruned:
    ``prune(conn, horizon_seconds, limit)`` deletes up to ``limit`` of them (rows, or a session's
    journal) and says how many."""

    what: str
    seconds: float
    prune: Callable[[Any, float, int], Awaitable[int]]
    batch: int = BATCH  # per transaction


def may_have_been_pruned(execution_id: str, now: float, ledger_horizon: float) -> bool:
    """Whether a command for ``execution_id``, absent from the ledger, is old enough that its
    row may have been pruned (so its absence does not prove it never ran here).

    Execution ids carry the time their intent was committed (``protocol.new_timed_id``), and a
    row is pruned only ``ledger_horizon`` after its last change, which comes after that time; a
    tenth of the horizon is left for clocks that disagree. An id without a time (made before
    ids had one) is judged as before: absent means never seen.
    """
    born = id_time(execution_id)
    if ledger_horizon <= 0 or born is None:
        return False
    return now - born > ledger_horizon * (1 - MARGIN)


def every(horizons: Sequence[Horizon]) -> float:
    """How often to prune: a quarter of the shortest horizon, at most hourly."""
    return min([3600.0] + [h.seconds / 4 for h in horizons if h.seconds > 0])


async def prune_once(transact: Callable[..., Awaitable[Any]], horizons: Sequence[Horizon]) -> dict[str, int]:
    """Prune every horizon down to nothing older, a batch per transaction; how many rows went."""
    counts: dict[str, int] = {}
    for h in horizons:
        if h.seconds <= 0:
            continue
        total = 0
        while True:
            gone: int = await transact(lambda conn, h=h: h.prune(conn, h.seconds, h.batch))
            total += gone
            if gone < h.batch:
                break
        if total:
            counts[h.what] = total
    return counts


async def keep_pruned(transact: Callable[..., Awaitable[Any]], horizons: Sequence[Horizon]) -> None:
    """:func:`prune_once` at start and then every :func:`every`, forever; failures are logged
    (the next round tries again: pruning may wait, the work may not)."""

    async def prune() -> None:
        counts = await prune_once(transact, horizons)
        if counts:
            log.info("retention_pruned", **counts)

    await BackgroundLoop("retention", prune, period=every(horizons)).run()
