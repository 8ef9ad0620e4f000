"""A turn's executions on PostgreSQL: many ids or steps in one statement (arrays, not loops; also
what a claim reads for many turns at once)."""

from __future__ import annotations

from collections.abc import Sequence

from brain.store.executions import Executions
from infra.db import Connection, Row

_STEPS_EXECUTIONS = """
SELECT e.* FROM unnest($1::text[], $2::int[]) AS s(turn_id, tool_step)
  JOIN executions e ON e.turn_id = s.turn_id AND e.tool_step = s.tool_step
 ORDER BY e.turn_id, e.tool_step, e.call_id"""


class PgExecutions(Executions):
    async def executions_by_id(self, conn: Connection, ids: Sequence[str]) -> dict[str, Row]:
        rows = await conn.fetch("SELECT * FROM executions WHERE id = ANY($1::text[])", list(ids))
        return {r["id"]: r for r in rows}

    async def steps_executions(
        self, conn: Connection, steps: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], list[Row]]:
        found: dict[tuple[str, int], list[Row]] = {step: [] for step in steps}
        for r in await conn.fetch(_STEPS_EXECUTIONS, [t for t, _ in found], [s for _, s in found]):
            found[(r["turn_id"], r["tool_step"])].append(r)
        return found
