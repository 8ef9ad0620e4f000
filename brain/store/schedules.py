"""Schedules on the Brain's side (``brain.rules.schedules``): their rows, and the ones due now.

A schedule is looked up within its namespace only (another namespace's id is not found). Firing
one is the caller's transaction: the due row locked (another Brain skips it), its turn accepted
(``Submits.submit_in``), and the row moved on, in one commit (invariant 19).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from brain.store.part import Part
from infra.db import Connection, Json
from infra.db.store import as_time

COLUMNS = (
    "id, namespace, request_id, input_digest, session_id, thread, agent, input, cron, next_at, paused, "
    "fires, last_due_at, last_fired_at, last_turn_id, last_error, created_at"
)


class Schedules(Part):
    async def now(self, conn: Connection) -> datetime:
        """The database's time: every Brain's schedules run on the one clock."""
        return as_time(await conn.fetchval("SELECT now()"))

    async def add(
        self, conn: Connection, schedule_id: str, namespace: str, request_id: str, input_digest: str,
        session_id: str, thread: str, agent: Any, text: str, cron: str | None, next_at: datetime,
    ) -> Any:  # fmt: skip
        return await conn.fetchrow(
            f"""INSERT INTO schedules (id, namespace, request_id, input_digest, session_id, thread, agent,
                                       input, cron, next_at)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING {COLUMNS}""",
            schedule_id, namespace, request_id, input_digest, session_id, thread, Json(agent), text, cron,
            next_at,
        )  # fmt: skip

    async def by_request(self, conn: Connection, namespace: str, request_id: str) -> Any:
        return await conn.fetchrow(
            f"SELECT {COLUMNS} FROM schedules WHERE namespace = $1 AND request_id = $2", namespace, request_id
        )

    async def get(self, conn: Connection, namespace: str, schedule_id: str, *, lock: bool = False) -> Any:
        return await conn.fetchrow(
            f"SELECT {COLUMNS} FROM schedules WHERE id = $1 AND namespace = $2"
            f"{self.store.FOR_UPDATE if lock else ''}",
            schedule_id,
            namespace,
        )

    async def listed(self, conn: Connection, namespace: str, limit: int) -> list[Any]:
        return list(
            await conn.fetch(
                f"SELECT {COLUMNS} FROM schedules WHERE namespace = $1 ORDER BY created_at, id LIMIT $2",
                namespace,
                limit,
            )
        )

    async def set_paused(self, conn: Connection, schedule_id: str, paused: bool) -> None:
        await conn.execute("UPDATE schedules SET paused = $2 WHERE id = $1", schedule_id, paused)

    async def delete(self, conn: Connection, schedule_id: str) -> None:
        await conn.execute("DELETE FROM schedules WHERE id = $1", schedule_id)

    async def due(self, conn: Connection, limit: int) -> list[Any]:
        """The schedules whose time came, locked (other Brains skip them), the most overdue first."""
        return list(
            await conn.fetch(
                f"""SELECT {COLUMNS}, now() AS now FROM schedules
                     WHERE next_at <= now() AND NOT paused
                     ORDER BY next_at LIMIT $1{self.store.SKIP_LOCKED}""",
                limit,
            )
        )

    async def fired(
        self, conn: Connection, schedule_id: str, due: datetime, next_at: datetime | None,
        turn_id: str | None, error: str | None,
    ) -> None:  # fmt: skip
        """Move a schedule on from the time it fired for (``due``): its next time (None: done), the
        turn it submitted, or why it could not."""
        await conn.execute(
            """UPDATE schedules SET next_at = $3, fires = fires + 1, last_due_at = $2, last_fired_at = now(),
                      last_turn_id = COALESCE($4, last_turn_id), last_error = $5
                WHERE id = $1""",
            schedule_id, due, next_at, turn_id, error,
        )  # fmt: skip
