"""The repair scan's reads and writes on PostgreSQL: the due waiting turns and their open executions
in one statement, the next looks of many turns in one more."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from brain.store.repairs import Repairs
from brain.store.sql import OPEN_SQL
from infra.db import Connection

_DUE_WAITING = f"""
WITH due AS (
    SELECT id FROM turns WHERE status = 'waiting' AND phase = 'wait_tools' AND wake_at <= now()
     ORDER BY wake_at LIMIT $1 FOR UPDATE SKIP LOCKED)
SELECT due.id AS turn_id, e.id, e.status, e.last_seq, e.route, e.request_digest, e.command_message_id,
       e.command, e.nudges, e.stall_backoff, e.created_at, e.updated_at, e.replay_requested_at,
       t.namespace, t.session_id, now() AS now,
       EXISTS (SELECT 1 FROM workers w WHERE w.id = e.created_by AND w.dead_at IS NULL) AS creator_alive,
       t.cancel_requested AS cancelling
  FROM due JOIN turns t ON t.id = due.id
  LEFT JOIN executions e ON e.turn_id = t.id AND e.tool_step = t.tool_step AND e.status IN {OPEN_SQL}
 ORDER BY due.id, e.call_id"""


class PgRepairs(Repairs):
    async def due_waiting(self, conn: Connection, limit: int = 100) -> list[Any]:
        rows = await conn.fetch(_DUE_WAITING, limit)
        return [r if r["id"] is not None else {"turn_id": r["turn_id"], "id": None} for r in rows]

    async def look_later(self, conn: Connection, looks: Mapping[str, float]) -> None:
        await conn.execute(
            """UPDATE turns t SET wake_at = ts_add(now(), l.seconds)
                 FROM unnest($1::text[], $2::float8[]) AS l(id, seconds)
                WHERE t.id = l.id AND t.status = 'waiting'""",
            list(looks),
            list(looks.values()),
        )
