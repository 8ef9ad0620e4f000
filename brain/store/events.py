"""Public events: what observers read, with a per-session sequence as their cursor."""

from __future__ import annotations

from typing import Any

import asyncpg

from infra.db import dialect


# The session row hands out the seq, so its lock orders a session's events by commit (an
# observer's cursor never skips one that commits late). PostgreSQL does it in one round
# trip; SQLite has no data-modifying WITH, and its statements cost no round trip anyway.
def cte(session: str, turn: str, kind: str, data: str, source: str = "") -> str:
    """Two CTEs (``next_event``, ``public_event``) that append one public event as part of a
    bigger PostgreSQL statement: the change and its event in one round trip.

    Each argument is an SQL expression; ``source`` adds FROM items they may refer to (e.g.
    ``", moved m"``). ``public_event`` returns the event's ``seq``.
    """
    return f"""next_event AS (
        UPDATE sessions SET last_event_seq = last_event_seq + 1 WHERE id = {session}
        RETURNING last_event_seq),
    public_event AS (
        INSERT INTO public_events (session_id, seq, turn_id, kind, data)
        SELECT {session}, next_event.last_event_seq, {turn}, {kind}, {data} FROM next_event{source}
        RETURNING seq)"""


_APPEND_PG = f"WITH {cte('$1::text', '$2::text', '$3::text', '$4::jsonb')} SELECT seq FROM public_event"


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
