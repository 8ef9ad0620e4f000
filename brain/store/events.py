"""Public events: what observers read, with a per-session sequence as their cursor."""

from __future__ import annotations

from typing import Any

import asyncpg

from infra.db import dialect

# The session row hands out the seq, so its lock orders a session's events by commit (an
# observer's cursor never skips one that commits late). PostgreSQL does it in one round
# trip; SQLite has no data-modifying WITH, and its statements cost no round trip anyway.
_APPEND_PG = """
    WITH next AS (UPDATE sessions SET last_event_seq = last_event_seq + 1 WHERE id = $1
                  RETURNING last_event_seq)
    INSERT INTO public_events (session_id, seq, turn_id, kind, data)
    SELECT $1::text, last_event_seq, $2::text, $3::text, $4::jsonb FROM next
    RETURNING seq"""


async def append(
    conn: asyncpg.Connection, session_id: str, turn_id: str | None, kind: str, data: dict[str, Any]
) -> int:
    """Append one public event inside the caller's transaction; returns its session seq."""
    if dialect(conn) == "postgres":
        return int(await conn.fetchval(_APPEND_PG, session_id, turn_id, kind, data))
    seq: int = await conn.fetchval(
        "UPDATE sessions SET last_event_seq = last_event_seq + 1 WHERE id = $1 RETURNING last_event_seq",
        session_id,
    )
    await conn.execute(
        "INSERT INTO public_events (session_id, seq, turn_id, kind, data) VALUES ($1, $2, $3, $4, $5)",
        session_id,
        seq,
        turn_id,
        kind,
        data,
    )
    return seq


async def wake(conn: asyncpg.Connection, channel: str) -> None:
    """A hint to idle Brains that work is claimable; sent at commit, never relied upon alone."""
    await conn.execute("SELECT pg_notify($1, '')", channel)
