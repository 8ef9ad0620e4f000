"""A turn's description on PostgreSQL: one statement (one round trip, one snapshot)."""

from __future__ import annotations

import json
from typing import Any

from brain.rules.records import Entry, TurnRow, TurnView
from brain.store.sql import JOURNAL_COLUMNS, TURN_COLUMNS, VIEW_EXECUTION_COLUMNS, column_names, qualified
from brain.store.views import Views
from infra.db import Connection

_TURN_COLS = qualified("t", TURN_COLUMNS)

_JSONB = {"facts", "result", "error", "input_request"}  # the jsonb columns of a turn's view


def _row_of(alias: str, columns: str) -> str:
    """``ROW(...)`` of ``columns``, its jsonb ones as text: asyncpg decodes the fields of an
    anonymous row in binary, which the pool's JSON codec (text) does not read."""
    fields = [f"{alias}.{c}::text" if c in _JSONB else f"{alias}.{c}" for c in column_names(columns)]
    return f"ROW({', '.join(fields)})"


_ENTRY_FIELDS = column_names(JOURNAL_COLUMNS)
_VIEW_FIELDS = column_names(VIEW_EXECUTION_COLUMNS)
# A turn's description in one statement (one round trip, one snapshot): its entries and
# executions as arrays of anonymous rows, which asyncpg gives as tuples.
_TURN_VIEW = f"""
SELECT {_TURN_COLS},
       ARRAY(SELECT {_row_of("j", JOURNAL_COLUMNS)} FROM journal j
              WHERE j.session_id = t.session_id AND j.turn_id = t.id ORDER BY j.seq) AS view_entries,
       ARRAY(SELECT {_row_of("e", VIEW_EXECUTION_COLUMNS)} FROM executions e
              WHERE e.turn_id = t.id ORDER BY e.tool_step, e.call_id) AS view_executions
  FROM turns t WHERE t.id = $1 AND t.namespace = $2"""


def _fields(names: list[str], row: tuple[Any, ...]) -> dict[str, Any]:
    return {k: json.loads(v) if k in _JSONB and v is not None else v for k, v in zip(names, row, strict=True)}


class PgViews(Views):
    async def turn_view(self, conn: Connection, namespace: str, turn_id: str) -> TurnView | None:
        rec = await conn.fetchrow(_TURN_VIEW, turn_id, namespace)
        if rec is None:
            return None
        return TurnView(
            TurnRow.from_record(rec),
            [Entry(**_fields(_ENTRY_FIELDS, row)) for row in rec["view_entries"]],
            [_fields(_VIEW_FIELDS, row) for row in rec["view_executions"]],
        )
