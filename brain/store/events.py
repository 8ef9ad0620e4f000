"""Public events: what observers read, with a per-session sequence as their cursor."""

from __future__ import annotations

from typing import Any

import asyncpg


async def append(
    conn: asyncpg.Connection, session_id: str, turn_id: str | None, kind: str, data: dict[str, Any]
) -> int:
    """Append one public event inside the caller's transaction; returns its session seq."""
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
