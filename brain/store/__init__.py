"""The Brain's store: all of its SQL, behind one object per backend, composed of parts.

=================  =========================  ====================================================
field              part (PostgreSQL's)        what it owns
=================  =========================  ====================================================
``journal``        ``Journal`` (``_pg``)      one entry per commit, a per-session seq
``submits``        ``Submits`` (``_pg``)      submits, and a served submit that starts its turn in
                                              its commit; the submits that arrive together
``turns``          ``Turns`` (``_pg``)        claims, leases, the fenced moves of runs, a turn read
``sessions``       ``Sessions``               sessions and threads as users see them; closing
``bindings``       ``Bindings`` (``_pg``)     announced tool bindings, threads, agent definitions
``executions``     ``Executions`` (``_pg``)   a turn's executions as the Brain reads them
``events``         ``Events`` (``_pg``)       applying Hands' events (waking or claiming turns)
``repairs``        ``Repairs`` (``_pg``)      what the repair scan looks at, the wake-ups it mends
``failures``       ``Failures``               failing a turn and settling what it leaves open
``outbox``         ``Outbox`` (``_pg``)       controls for the Hands, published after the commit
``controls``       ``Controls``               controls' receipts and what they do to a turn; a
                                              person's answer to a call
``inputs``         ``Inputs``                 what running executions ask a person; its answer
``views``          ``Views`` (``_pg``)        a turn as its description reads it
``waits``          ``Waits``                  built-in waits: those the clock answers, a signal's
``batches``        ``Batches``                batch calls' manifests, and admitting their children
``schedules``      ``Schedules``              schedules, and those due now
``delegations``    ``Delegations``            parent calls and the child turns they started
``metadata``       ``Metadata``               sessions' and threads' metadata (string pairs)
``langgraph``      ``LangGraph``              the LangGraph API's assistants and runs
``gauges``         ``GaugeRows``              what the metrics count when scraped
``retention``      ``RetentionRows``          what retention prunes (the journal of closed sessions)
``forks``          ``Forks``                  forks of threads (their lineage) and rewinds
=================  =========================  ====================================================

Each part is the portable statements in ``<part>.py`` (what the embedded mode runs on SQLite), and
where PostgreSQL does it faster (many rows per statement, one round trip per commit) a subclass
with the same methods in ``<part>_pg.py`` beside it. :func:`brain_store` picks the backend from
the pool; nothing above the store asks which one it has. Every method takes the connection of a
transaction its caller owns (``store.transact``), typed as ``infra.db.Connection``. Status sets
and status writes are spelled from the state tables (``sql``). Migrations are versioned SQL files
per dialect in ``migrations/``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

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
from brain.store.batches import Batches
from brain.store.bindings import Bindings
from brain.store.bindings_pg import PgBindings
from brain.store.controls import Controls
from brain.store.delegations import Delegations
from brain.store.events import Events
from brain.store.events_pg import PgEvents
from brain.store.executions import Executions
from brain.store.executions_pg import PgExecutions
from brain.store.failures import Failures
from brain.store.forks import Forks
from brain.store.gauges import GaugeRows, Gauges
from brain.store.inputs import Inputs
from brain.store.journal import Journal
from brain.store.journal_pg import PgJournal
from brain.store.langgraph import LangGraph
from brain.store.metadata import Metadata
from brain.store.outbox import Outbox
from brain.store.outbox_pg import PgOutbox
from brain.store.repairs import Repairs
from brain.store.repairs_pg import PgRepairs
from brain.store.retention import RetentionRows
from brain.store.schedules import Schedules
from brain.store.sessions import Sessions
from brain.store.submits import Submits
from brain.store.submits_pg import PgSubmits
from brain.store.turns import Turns
from brain.store.turns_pg import PgTurns
from brain.store.views import Views
from brain.store.views_pg import PgViews
from brain.store.waits import Waits
from infra.db import Connection, Pool, create_pool, dialect, migrate, reading
from infra.db.parked import ParkedRows
from infra.db.store import StoreBase
from infra.process.settings import Settings
from infra.process.startup import wait_for

T = TypeVar("T")

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


class BrainStore(StoreBase, ParkedRows):
    """The portable store (what the embedded mode runs on SQLite), composed of its parts."""

    journal: Journal
    submits: Submits
    turns: Turns
    sessions: Sessions
    bindings: Bindings
    executions: Executions
    events: Events
    repairs: Repairs
    failures: Failures
    outbox: Outbox
    controls: Controls
    inputs: Inputs
    views: Views
    waits: Waits
    batches: Batches
    schedules: Schedules
    delegations: Delegations
    metadata: Metadata
    langgraph: LangGraph
    gauges: GaugeRows
    retention: RetentionRows
    forks: Forks

    def __init__(self, pool: Pool) -> None:
        super().__init__(pool)
        self.journal = Journal(self)
        self.submits = Submits(self)
        self.turns = Turns(self)
        self.sessions = Sessions(self)
        self.bindings = Bindings(self)
        self.executions = Executions(self)
        self.events = Events(self)
        self.repairs = Repairs(self)
        self.failures = Failures(self)
        self.outbox = Outbox(self)
        self.controls = Controls(self)
        self.inputs = Inputs(self)
        self.views = Views(self)
        self.waits = Waits(self)
        self.batches = Batches(self)
        self.schedules = Schedules(self)
        self.delegations = Delegations(self)
        self.metadata = Metadata(self)
        self.langgraph = LangGraph(self)
        self.gauges = GaugeRows(self)
        self.retention = RetentionRows(self)
        self.forks = Forks(self)


class PostgresBrainStore(BrainStore):
    """The store on PostgreSQL: the parts PostgreSQL does faster are its own."""

    FOR_UPDATE = " FOR UPDATE"
    SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"
    ONE_STATEMENT_COMMITS = True
    HOLDS_CONNECTIONS = True

    def __init__(self, pool: Pool) -> None:
        super().__init__(pool)
        self.journal = PgJournal(self)
        self.submits = PgSubmits(self)
        self.turns = PgTurns(self)
        self.bindings = PgBindings(self)
        self.executions = PgExecutions(self)
        self.events = PgEvents(self)
        self.repairs = PgRepairs(self)
        self.outbox = PgOutbox(self)
        self.views = PgViews(self)

    async def read_consistent(self, work: Callable[[Connection], Awaitable[T]]) -> T:
        async with reading(self.pool) as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            return await work(conn)


def brain_store(pool: Pool) -> BrainStore:
    """The store for ``pool``: the PostgreSQL backend for an asyncpg pool, else the portable one."""
    return PostgresBrainStore(pool) if dialect(pool) == "postgres" else BrainStore(pool)


async def open_brain_store(pool: Pool, schema: str = "brain") -> BrainStore:
    """:func:`brain_store`, with the schema's migrations applied first."""
    await migrate(pool, schema, MIGRATIONS)
    return brain_store(pool)


async def open_store(settings: Settings, *, patience: float = 0.0, name: str | None = None) -> BrainStore:
    """The migrated Brain store on PostgreSQL (used by `serve` and the CLI verbs), waiting up to
    ``patience`` seconds for the database to answer; ``name``: its sessions' (a worker's)."""
    pool = await wait_for(
        partial(
            create_pool,
            settings.database_url,
            settings.brain_schema,
            max_size=settings.db_pool_size,
            name=name,
        ),
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
