"""The Hands ledger: all of its SQL, behind one object per backend.

``ledger.Ledger`` is the portable base (what the embedded mode runs on SQLite);
``postgres.PostgresLedger`` does the same on PostgreSQL with many rows per statement.
:func:`open_ledger` picks the backend from the pool; nothing above the store asks which one it
has. Migrations are versioned SQL files per dialect in ``migrations/``.

Tables (in the pool's own schema, ``settings.hands_schema``):

- ``workers`` / ``worker_lock_seq``: live processes, see ``infra.liveness``;
- ``executions``: one row per execution id: the command, status, owner, attempts, and its status
  events (the packed envelopes, in seq order); a parked one (``Ledger.park``) its wake time;
- ``output_chunks``: the tool's output pages by byte offset, with their seq;
- ``reconciliations``: the audit record of every UNKNOWN resolved by a person;
- ``parked``: messages the broker parked (``infra.db.parked``).

What retention prunes, and what it never touches, is in ``retention``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hands.store.ledger import PARKED_PREFIX, Ledger
from hands.store.postgres import PostgresLedger
from hands.store.records import Change, Execution, NewExecution
from infra.db import dialect, migrate

MIGRATIONS = Path(__file__).resolve().parent / "migrations"

__all__ = [
    "MIGRATIONS",
    "PARKED_PREFIX",
    "Change",
    "Execution",
    "Ledger",
    "NewExecution",
    "PostgresLedger",
    "ledger_for",
    "open_ledger",
]


def ledger_for(pool: Any) -> Ledger:
    """The ledger on ``pool``: the PostgreSQL backend for an asyncpg pool, else the portable one."""
    return PostgresLedger(pool) if dialect(pool) == "postgres" else Ledger(pool)


async def open_ledger(pool: Any, schema: str = "hands") -> tuple[Ledger, int]:
    """:func:`ledger_for`, with the schema's migrations applied first (and how many were)."""
    applied = await migrate(pool, schema, MIGRATIONS)
    return ledger_for(pool), applied
