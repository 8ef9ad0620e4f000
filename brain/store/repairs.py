"""What the repair scan looks at on the Brain's side (and how it counts its nudges), and the
wake-ups it repairs.

The scan starts from the turns that wait: a waiting turn's ``wake_at`` is when to look at it
next, so the executions themselves need no index on their status or times (applying an event
stays a HOT update) and a turn whose tools answer in time is never looked at.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from brain.rules.states import TurnStatus
from brain.store.events import SETTLED
from brain.store.part import Part
from brain.store.sql import OPEN_SQL, SEQUENCED_SQL, turn_becomes
from infra.db import Connection
from infra.db.store import as_time

# Turns that wait (for their bindings' deadline, or with nothing left to wait for) go on.
_WOKEN = turn_becomes(TurnStatus.RUNNING, from_={TurnStatus.WAITING})


class Repairs(Part):
    # ---- what the scan looks at --------------------------------------------------------

    async def due_waiting(self, conn: Connection, limit: int = 100) -> list[Any]:
        """Waiting turns whose time to be looked at came, locked (others skip them), with the
        executions of their current step that are not final: one row per execution, with
        ``creator_alive`` (the Brain that committed its intent still lives)."""
        turns = await conn.fetch(
            f"""SELECT id FROM turns WHERE status = 'waiting' AND phase = 'wait_tools' AND wake_at <= now()
                 ORDER BY wake_at LIMIT $1{self.store.SKIP_LOCKED}""",
            limit,
        )
        rows: list[Any] = []
        for t in turns:
            rows += await conn.fetch(
                f"""SELECT e.id, e.turn_id, e.status, e.last_seq, e.route, e.request_digest,
                           e.command_message_id, e.command, e.nudges, e.stall_backoff, e.created_at,
                           e.updated_at, e.replay_requested_at, t.namespace, t.session_id, now() AS now,
                           EXISTS (SELECT 1 FROM workers w WHERE w.id = e.created_by AND w.dead_at IS NULL)
                             AS creator_alive, t.cancel_requested AS cancelling
                      FROM turns t JOIN executions e ON e.turn_id = t.id AND e.tool_step = t.tool_step
                     WHERE t.id = $1 AND e.status IN {OPEN_SQL}
                     ORDER BY e.call_id""",
                t["id"],
            )
            if not any(r["turn_id"] == t["id"] for r in rows):
                rows.append({"turn_id": t["id"], "id": None})  # nothing open: only a look later
        return [{**dict(r), "now": as_time(r["now"])} if r["id"] is not None else r for r in rows]

    async def look_later(self, conn: Connection, looks: Mapping[str, float]) -> None:
        """When the scan looks at waiting turns next: seconds from now, by turn id (one
        statement where the backend can)."""
        for turn_id, seconds in looks.items():
            await conn.execute(
                "UPDATE turns SET wake_at = ts_add(now(), $2) WHERE id = $1 AND status = 'waiting'",
                turn_id,
                seconds,
            )

    async def mark_nudged(self, conn: Connection, execution_id: str) -> None:
        """Record that a command was re-sent or a replay asked for (or that nobody serves its
        route): the next nudge waits longer, and an answer (any event) resets the count."""
        await conn.execute(
            """UPDATE executions SET replay_requested_at = now(), nudges = nudges + 1,
                      stall_backoff = CASE WHEN stall_backoff >= 32 THEN 64 ELSE stall_backoff * 2 END
                WHERE id = $1""",
            execution_id,
        )

    async def gaps_to_replay(self, conn: Connection, gap_seconds: float) -> list[Any]:
        """Executions whose held events have waited longer than ``gap_seconds`` for a missing seq."""
        return list(
            await conn.fetch(
                f"""SELECT e.id, e.turn_id, e.status, e.last_seq, e.route, e.request_digest, e.nudges,
                           t.namespace, t.session_id
                      FROM executions e JOIN turns t ON t.id = e.turn_id
                     WHERE e.holding AND e.status IN {SEQUENCED_SQL}
                       AND EXISTS (SELECT 1 FROM held_events h WHERE h.execution_id = e.id
                                     AND h.received_at < ts_add(now(), $1))
                       AND (e.replay_requested_at IS NULL
                            OR e.replay_requested_at
                               < ts_add(now(), CAST($2 AS double precision) * e.stall_backoff))
                       {self.store.FOR_UPDATE}""",
                -gap_seconds,
                -4 * gap_seconds,
            )
        )

    async def wake_due(self, conn: Connection, wake_channel: str) -> int:
        """Turns waiting for tool bindings whose deadline came: claimable again, so that their
        run says why they cannot go on."""
        woken = await conn.fetch(
            f"""UPDATE turns SET {_WOKEN.set}, updated_at = now()
                WHERE {_WOKEN.guard} AND phase = 'prepare' AND wake_at <= now() RETURNING id"""
        )
        if woken:
            await conn.execute("SELECT pg_notify($1, '')", wake_channel)
        return len(woken)

    async def wake_stuck(self, conn: Connection, wake_channel: str) -> int:
        """Repair lost hints: waiting turns whose current step has nothing left to wait for."""
        woken = await conn.fetch(
            f"""UPDATE turns AS t SET {_WOKEN.set}, wake_at = now(), waiting_for = NULL,
                       updated_at = now(), revision = revision + 1
                 WHERE {_WOKEN.guard} AND phase = 'wait_tools' AND wake_at <= now()
                   AND EXISTS (SELECT 1 FROM executions e
                                WHERE e.turn_id = t.id AND e.tool_step = t.tool_step)
                   AND {SETTLED}
             RETURNING id"""
        )
        if woken:
            await conn.execute("SELECT pg_notify($1, '')", wake_channel)
        return len(woken)
