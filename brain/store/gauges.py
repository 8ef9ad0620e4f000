"""What the metrics read of the record when they are scraped: how many turns and executions are
in each state, how far behind the relays are, how many messages are parked.

Counted by ``GROUP BY`` over the tables: a scrape costs one pass over turns and executions, which
the metrics cache for a few seconds (``brain.run.metrics``) so that several scrapers cost no more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from brain.store.part import Part
from infra.db import Connection
from infra.db.store import as_time


@dataclass(frozen=True)
class Gauges:
    turns: dict[str, int] = field(default_factory=dict)  # status -> how many
    executions: dict[str, int] = field(default_factory=dict)  # status -> how many
    # Seconds since the oldest control still unpublished was committed (0: none waits).
    outbox_lag: float = 0.0
    # Seconds since the oldest tool intent no Hands worker has taken yet was committed.
    relay_lag: float = 0.0
    # Messages parked from the Brain's own queues (updates, bindings): queue -> how many. A Hands
    # pool records those of its route's queues (commands, controls) in its own ledger.
    parked: dict[str, int] = field(default_factory=dict)


def _age(now: datetime, oldest: Any) -> float:
    return 0.0 if oldest is None else max(0.0, (now - as_time(oldest)).total_seconds())


class GaugeRows(Part):
    async def count(self, conn: Connection) -> Gauges:
        turns = await conn.fetch("SELECT status, count(*) AS n FROM turns GROUP BY status")
        executions = await conn.fetch("SELECT status, count(*) AS n FROM executions GROUP BY status")
        row = await conn.fetchrow(
            """SELECT now() AS now,
                      (SELECT min(created_at) FROM outbox WHERE published_at IS NULL) AS outbox,
                      (SELECT min(created_at) FROM executions WHERE status = 'intended') AS intents"""
        )
        parked = await conn.fetch("SELECT queue, count(*) AS n FROM parked GROUP BY queue")
        assert row is not None  # a SELECT without FROM returns its one row
        now = as_time(row["now"])
        return Gauges(
            turns={r["status"]: int(r["n"]) for r in turns},
            executions={r["status"]: int(r["n"]) for r in executions},
            outbox_lag=_age(now, row["outbox"]),
            relay_lag=_age(now, row["intents"]),
            parked={r["queue"]: int(r["n"]) for r in parked},
        )
