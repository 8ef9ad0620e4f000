"""The database room: everything that talks SQL to PostgreSQL or SQLite below the stores.

==================  =========================================================================
module              what it holds
==================  =========================================================================
``connection``      the typed boundary: what a connection and a pool offer (asyncpg, SQLite)
``postgres``        the pool every process opens, its session settings and names, lock and dialect names
``sqlite``          SQLite behind the same connection API (the embedded mode)
``transact``        the one transaction helper, reads outside it, riding out a lost database
``held``            a connection a group committer keeps between its transactions
``groupcommit``     changes of concurrent callers in one transaction
``store``           what every store backend shares: its pool, flags and spellings
``rows``            many rows per statement from arrays (PostgreSQL)
``values``          values bound for JSON columns
``migrate``         versioned SQL migrations per dialect
``statistics``      ANALYZE of young tables
``notify``          wake-up hints over LISTEN/NOTIFY
``parked``          the parked messages table both stores keep
``retention``       pruning what is finished after its horizon
==================  =========================================================================

The names below are the room's public face; its modules import each other directly.
"""

from infra.db.connection import Connection, Pool, Row
from infra.db.migrate import migrate, migration_files
from infra.db.postgres import (
    IDLE_IN_TRANSACTION,
    create_pool,
    dialect,
    lock_class,
    session_name,
    session_settings,
)
from infra.db.statistics import analyze_grown, keep_statistics
from infra.db.transact import (
    OUTAGE_PATIENCE,
    TRANSACT_ATTEMPTS,
    is_transient,
    patiently,
    reading,
    transact,
)
from infra.db.values import Json, as_json

__all__ = [
    "IDLE_IN_TRANSACTION",
    "OUTAGE_PATIENCE",
    "TRANSACT_ATTEMPTS",
    "Connection",
    "Json",
    "Pool",
    "Row",
    "analyze_grown",
    "as_json",
    "create_pool",
    "dialect",
    "is_transient",
    "keep_statistics",
    "lock_class",
    "migrate",
    "migration_files",
    "patiently",
    "reading",
    "session_name",
    "session_settings",
    "transact",
]
