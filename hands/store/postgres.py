"""The PostgreSQL backend of the Hands ledger: many rows per statement (arrays unnested), events
appended in place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hands.rules.states import OPEN_STATUSES, LedgerStatus, transition
from hands.store.ledger import Ledger
from hands.store.records import STAMPED, Change, Execution, NewExecution
from infra.db import Connection, Json
from infra.db.rows import row_args, rows_from

# Every column a new row may set, and its array type.
_NEW = [
    ("execution_id", "text"), ("route", "text"), ("request_digest", "text"), ("namespace", "text"),
    ("session_id", "text"), ("turn_id", "text"), ("call_id", "text"), ("tool", "text"),
    ("binding_digest", "text"), ("replay_policy", "text"), ("args", "jsonb"), ("status", "text"),
    ("open", "bool"), ("owner", "text"), ("attempts", "int"), ("last_seq", "int"), ("events", "jsonb"),
    ("error", "jsonb"),
]  # fmt: skip


def _insert_sql(first: int) -> str:
    """Insert new rows from arrays $first..; a known id is left as it is."""
    arrays = ", ".join(f"${i}::{t}[]" for i, (_, t) in enumerate(_NEW, start=first))
    return f"""INSERT INTO executions ({", ".join(c for c, _ in _NEW)})
SELECT * FROM unnest({arrays})
    ON CONFLICT (execution_id) DO NOTHING"""


# The columns of a guarded change (one per row per statement) and their types.
_CHANGE = [
    ("id", "text"), ("status", "text"), ("open", "bool"), ("attempts", "int"), ("error", "jsonb"),
    ("output_bytes", "bigint"), ("last_seq", "int"), ("owner", "text"), ("from_status", "text"),
    ("from_seq", "int"), ("unless_cancelled", "bool"), ("events", "jsonb"),
]  # fmt: skip


def _changes_sql(first: int, *, one: bool = False) -> str:
    """Guarded changes from parameters $first.. (one per column of ``_CHANGE``; see
    ``infra.db.rows`` for ``one``)."""
    return f"""UPDATE executions e
   SET status = m.status, open = m.open, attempts = coalesce(m.attempts, e.attempts),
       error = coalesce(m.error, e.error), output_bytes = coalesce(m.output_bytes, e.output_bytes),
       last_seq = m.last_seq, events = e.events || m.events, updated_at = now()
  FROM {rows_from("m", _CHANGE, first, one=one)}
 WHERE e.execution_id = m.id AND e.owner = m.owner AND e.status = m.from_status AND e.last_seq = m.from_seq
   AND (NOT m.unless_cancelled OR NOT e.cancel_requested)"""


# An insert and a change return only what their caller does not hold (``NewExecution.inserted``
# and ``Change.after`` make the rest): not the row's events, arguments and error again, which
# asyncpg would decode for nothing. The marker names the statements that commit on their own
# (tests/hands_pg_proxy.py cuts them).
_STAMPED = ", ".join(STAMPED)
_STAMPED_OF_E = ", ".join(f"e.{c}" for c in STAMPED)
_INSERT = f"/* ledger commit */\n{_insert_sql(1)}\nRETURNING {_STAMPED}"
_CHANGES = {  # by whether the statement changes one row
    one: f"/* ledger commit */\n{_changes_sql(1, one=one)}\n"
    "RETURNING e.execution_id, e.updated_at, e.cancel_requested"
    for one in (False, True)
}
# Accepts and changes of other executions together: a change's row was committed before its task
# could make the change, so no row is both inserted and changed here (one snapshot serves both).
_BOTH = f"""/* ledger commit */
WITH inserted AS ({_insert_sql(1)} RETURNING true AS new, {_STAMPED}),
     changed AS ({_changes_sql(len(_NEW) + 1)} RETURNING false AS new, {_STAMPED_OF_E})
SELECT * FROM inserted UNION ALL SELECT * FROM changed"""


class PostgresLedger(Ledger):
    FOR_UPDATE = " FOR UPDATE"
    SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"
    ONE_STATEMENT_COMMITS = True
    HOLDS_CONNECTIONS = True
    APPEND = "events || $12"

    def appended(self, change: Change) -> list[dict[str, Any]]:
        return change.events

    async def exists(self) -> bool:
        return bool(await self.read(lambda c: c.fetchval("SELECT to_regclass('executions') IS NOT NULL")))

    async def insert(self, conn: Connection, rows: Sequence[NewExecution]) -> list[Execution | None]:
        return _inserted(rows, await conn.fetch(_INSERT, *_insert_columns(rows)))

    async def change(self, conn: Connection, changes: Sequence[Change]) -> list[Execution | None]:
        columns, first = _change_columns(changes)
        one = len(columns[0]) == 1
        recs = await conn.fetch(_CHANGES[one], *row_args(columns, one=one))
        return _changed(changes, first, recs)

    async def write(
        self, conn: Connection, rows: Sequence[NewExecution], changes: Sequence[Change]
    ) -> tuple[list[Execution | None], list[Execution | None]]:
        if not rows or not changes:
            return await super().write(conn, rows, changes)
        columns, first = _change_columns(changes)
        recs = await conn.fetch(_BOTH, *_insert_columns(rows), *columns)
        return (
            _inserted(rows, [r for r in recs if r["new"]]),
            _changed(changes, first, [r for r in recs if not r["new"]]),
        )

    async def release_owners(self, conn: Connection, owners: Sequence[str], died: bool = True) -> int:
        status = await conn.execute(
            """UPDATE executions SET owner = 'released-by:' || owner, updated_at = now()
                WHERE owner = ANY($1::text[]) AND open""",
            list(owners),
        )
        return int(str(status).split()[-1])


def _insert_columns(rows: Sequence[NewExecution]) -> list[list[Any]]:
    columns: list[list[Any]] = [[] for _ in _NEW]
    for new in rows:
        status = LedgerStatus(new.values["status"])
        values = {
            **new.values,
            "status": status.value,
            "open": status in OPEN_STATUSES,
            "attempts": new.values.get("attempts", 0),
            "last_seq": len(new.events),
            # jsonb[] elements: a list would read as one more array dimension
            "events": Json(new.events),
            "args": Json(new.values["args"]) if new.values.get("args") is not None else None,
            "error": Json(new.values["error"]) if new.values.get("error") is not None else None,
        }
        for col, (name, _) in zip(columns, _NEW, strict=True):
            col.append(values.get(name))
    return columns


def _inserted(rows: Sequence[NewExecution], recs: Sequence[Any]) -> list[Execution | None]:
    inserted = {r["execution_id"]: r for r in recs}
    # The same id twice in one batch (a command delivered twice at once): the first is the
    # new row, the other a duplicate, as they would be one after the other.
    out: list[Execution | None] = []
    for new in rows:
        rec = inserted.pop(new.execution_id, None)
        out.append(new.inserted(rec) if rec is not None else None)
    return out


def _change_columns(changes: Sequence[Change]) -> tuple[list[list[Any]], dict[str, int]]:
    """The arrays of the changes, and the index of each row's first change: one change per row
    per statement (an UPDATE applies one of several); a second change of the same row as the
    same task knew it would be refused by its guard after the first."""
    columns: list[list[Any]] = [[] for _ in _CHANGE]
    first = {c.before.execution_id: i for i, c in reversed(list(enumerate(changes)))}
    for c in (changes[i] for i in first.values()):
        transition(c.before.status, c.status)
        b = c.before
        values = [
            b.execution_id, str(c.status), c.open, c.attempts, c.error, c.output_bytes,
            b.last_seq + len(c.events), b.owner, str(b.status), b.last_seq, c.unless_cancelled,
            Json(c.events),
        ]  # fmt: skip
        for col, value in zip(columns, values, strict=True):
            col.append(value)
    return columns, first


def _changed(changes: Sequence[Change], first: dict[str, int], recs: Sequence[Any]) -> list[Execution | None]:
    changed = {r["execution_id"]: r for r in recs}
    out: list[Execution | None] = []
    for i, c in enumerate(changes):
        rec = changed.get(c.before.execution_id) if first[c.before.execution_id] == i else None
        out.append(c.after(rec["updated_at"], rec["cancel_requested"]) if rec is not None else None)
    return out
