"""The Brain's store: all of its SQL, behind one object per backend.

=========================  ==================================================================
part (portable base)       what it owns
=========================  ==================================================================
``journal.JournalRows``    the journal: one entry per commit, a per-session seq
``submits.SubmitRows``     submits, and a served submit that starts its turn in its commit;
                           the submits that arrive together, in one transaction
``turns.TurnRows``         claims, leases, the fenced moves of runs
``sessions.SessionRows``   sessions and threads as users see them: listing, closing
``bindings.BindingRows``   announced tool bindings, threads and agent definitions
``steps.StepRows``         a turn's executions as the Brain reads them
``executions...Rows``      applying Hands' events (waking or claiming their turns)
``repairs.RepairRows``     what the repair scan looks at, failing a turn, the controls outbox
``controls.ControlRows``   controls (steer, pause, cancel...): their receipts and what they do;
                           a turn as its description reads it (``turn_view``)
``gauges.GaugeRows``       what the metrics count when scraped (turns and executions by state)
``retention.RetentionRows`` what retention prunes (the journal of long-closed sessions)
``infra.transport.parked``           the parked messages (``ParkedRows``)
=========================  ==================================================================

The portable base runs as it is on SQLite (the embedded mode); ``pg_submits``, ``pg_turns`` and
``pg_events`` override what PostgreSQL does faster: many submits, turns or executions per
statement, one round trip per commit. :func:`open_brain_store` picks the backend from the
pool; nothing above the store asks which one it has. Migrations are versioned SQL files per
dialect in ``migrations/``.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from brain.rules.records import (
    Applied,
    ClaimBudget,
    Claimed,
    Control,
    Ended,
    Entry,
    Intent,
    Lease,
    Move,
    Moved,
    Settled,
    TurnRow,
)
from brain.store.controls import ControlRows
from brain.store.gauges import GaugeRows, Gauges
from brain.store.pg_events import PgExecutionRows
from brain.store.pg_turns import PgTurnRows
from brain.store.retention import RetentionRows
from infra.db import create_pool, dialect, migrate
from infra.process.settings import Settings
from infra.process.startup import wait_for
from infra.transport.parked import ParkedRows

MIGRATIONS = Path(__file__).resolve().parent / "migrations"

__all__ = [
    "MIGRATIONS",
    "Applied",
    "BrainStore",
    "ClaimBudget",
    "Claimed",
    "Control",
    "Ended",
    "Entry",
    "Gauges",
    "Intent",
    "Lease",
    "Move",
    "Moved",
    "PostgresBrainStore",
    "Settled",
    "TurnRow",
    "brain_store",
    "open_brain_store",
    "open_store",
    "wake_channel",
]


class BrainStore(ControlRows, GaugeRows, RetentionRows, ParkedRows):
    """The portable store (what the embedded mode runs on SQLite)."""


class PostgresBrainStore(PgExecutionRows, PgTurnRows, BrainStore):
    """The store on PostgreSQL."""


def brain_store(pool: Any) -> BrainStore:
    """The store for ``pool``: the PostgreSQL backend for an asyncpg pool, else the portable one."""
    return PostgresBrainStore(pool) if dialect(pool) == "postgres" else BrainStore(pool)


async def open_brain_store(pool: Any, schema: str = "brain") -> BrainStore:
    """:func:`brain_store`, with the schema's migrations applied first."""
    await migrate(pool, schema, MIGRATIONS)
    return brain_store(pool)


async def open_store(settings: Settings, *, patience: float = 0.0) -> BrainStore:
    """The migrated Brain store on PostgreSQL (used by `serve` and the CLI verbs), waiting up to
    ``patience`` seconds for the database to answer."""
    pool = await wait_for(
        partial(create_pool, settings.database_url, settings.brain_schema, max_size=settings.db_pool_size),
        service="PostgreSQL",
        url=settings.database_url,
        patience=patience,
    )
    try:
        return await open_brain_store(pool, settings.brain_schema)
    except BaseException:
        await pool.close()
        raise


def wake_channel(settings: Settings) -> str:
    """The channel a store's commits notify when a turn of the Brain's schema can go on."""
    return f"{settings.brain_schema}_wake"
