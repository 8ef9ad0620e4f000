"""The PostgreSQL backend of the Hands ledger: many rows per statement (arrays unnested), events
appended in place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hands.states import OPEN_STATUSES, LedgerStatus, transition
from hands.store.ledger import Ledger
from hands.store.records import EXECUTION_COLUMNS, Change, Execution, NewExecution
from infra.db import Json

# Every column a new row may set, and its array type.
_NEW = [
    ("execution_id", "text"), ("route", "text"), ("request_digest", "text"), ("namespace", "text"),
    ("session_id", "text"), ("turn_id", "text"), ("call_id", "text"), ("tool", "text"),
    ("binding_digest", "text"), ("replay_policy", "text"), ("args", "jsonb"), ("status", "text"),
    ("open", "bool"), ("owner", "text"), ("attempts", "int"), ("last_seq", "int"), ("events", "jsonb"),
    ("error", "jsonb"),
]  # fmt: skip
# The marker names the statements that commit on their own (tests/hands_pg_proxy.py cuts them).
_INSERT = f"""/* ledger commit */
INSERT INTO executions ({", ".join(c for c, _ in _NEW)})
SELECT * FROM unnest({", ".join(f"${i}::{t}[]" for i, (_, t) in enumerate(_NEW, start=1))})
    ON CONFLICT (execution_id) DO NOTHING
RETURNING {EXECUTION_COLUMNS}"""

_CHANGES = f"""/* ledger commit */
UPDATE executions e
   SET status = m.status, open = m.open, attempts = coalesce(m.attempts, e.attempts),
       error = coalesce(m.error, e.error), output_bytes = coalesce(m.output_bytes, e.output_bytes),
       last_seq = m.last_seq, events = e.events || m.events, updated_at = now()
  FROM unnest($1::text[], $2::text[], $3::bool[], $4::int[], $5::jsonb[], $6::bigint[], $7::int[], $8::text[],
              $9::text[], $10::int[], $11::bool[], $12::jsonb[])
       AS m(id, status, open, attempts, error, output_bytes, last_seq, owner, from_status, from_seq,
            unless_cancelled, events)
 WHERE e.execution_id = m.id AND e.owner = m.owner AND e.status = m.from_status AND e.last_seq = m.from_seq
   AND (NOT m.unless_cancelled OR NOT e.cancel_requested)
RETURNING {", ".join("e." + c.strip() for c in EXECUTION_COLUMNS.split(","))}"""


class PostgresLedger(Ledger):
    FOR_UPDATE = " FOR UPDATE"
    SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"
    ONE_STATEMENT_COMMITS = True
    APPEND = "events || $12"

    def appended(self, change: Change) -> list[dict[str, Any]]:
        return change.events

    async def exists(self) -> bool:
        return bool(await self.read(lambda c: c.fetchval("SELECT to_regclass('executions') IS NOT NULL")))

    async def insert(self, conn: Any, rows: Sequence[NewExecution]) -> list[Execution | None]:
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
        recs = await conn.fetch(_INSERT, *columns)
        inserted = {r["execution_id"]: Execution.from_record(r) for r in recs}
        # The same id twice in one batch (a command delivered twice at once): the first is the
        # new row, the other a duplicate, as they would be one after the other.
        return [inserted.pop(new.execution_id, None) for new in rows]

    async def change(self, conn: Any, changes: Sequence[Change]) -> list[Execution | None]:
        columns: list[list[Any]] = [[] for _ in range(12)]
        # One change per row per statement (an UPDATE applies one of several): a second change of
        # the same row as the same task knew it would be refused by its guard after the first.
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
        recs = await conn.fetch(_CHANGES, *columns)
        changed = {r["execution_id"]: Execution.from_record(r) for r in recs}
        return [changed.get(c.before.execution_id) if first[c.before.execution_id] == i else None
                for i, c in enumerate(changes)]  # fmt: skip

    async def release_owners(self, conn: Any, owners: Sequence[str], died: bool = True) -> int:
        status = await conn.execute(
            """UPDATE executions SET owner = 'released-by:' || owner, updated_at = now()
                WHERE owner = ANY($1::text[]) AND open""",
            list(owners),
        )
        return int(str(status).split()[-1])
