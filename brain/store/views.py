"""A turn as it is described: its row, its journal entries and its executions, read at one moment
where the backend can (``views_pg``: one statement)."""

from __future__ import annotations

from brain.rules.records import TurnView
from brain.store.part import Part
from brain.store.sql import VIEW_EXECUTION_COLUMNS
from infra.db import Connection


class Views(Part):
    async def turn_view(self, conn: Connection, namespace: str, turn_id: str) -> TurnView | None:
        """The turn (if it is ``namespace``'s) with its journal entries and executions: one
        statement, and so one moment, where the backend can."""
        turn = await self.store.turns.lock_turn(conn, namespace, turn_id, lock=False)
        if turn is None:
            return None
        entries = await self.store.journal.entries(conn, turn.session_id, turn_id=turn_id, limit=100_000)
        rows = await conn.fetch(
            f"SELECT {VIEW_EXECUTION_COLUMNS} FROM executions WHERE turn_id = $1 ORDER BY tool_step, call_id",
            turn_id,
        )
        return TurnView(turn, entries, [dict(r) for r in rows])
