"""Outbox rows: committed with the state that caused them, published after commit by the relay."""

from __future__ import annotations

import asyncpg


async def add(conn: asyncpg.Connection, queue: str, message_id: str, payload: bytes) -> None:
    await conn.execute(
        "INSERT INTO outbox (queue, message_id, payload) VALUES ($1, $2, $3)",
        queue,
        message_id,
        payload,
    )


async def unpublished(conn: asyncpg.Connection, limit: int = 200) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT id, queue, message_id, payload FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT $1",
        limit,
    )


async def mark_published(conn: asyncpg.Connection, ids: list[int]) -> None:
    await conn.execute("UPDATE outbox SET published_at = now() WHERE id = ANY($1::bigint[])", ids)


async def republish(conn: asyncpg.Connection, message_id: str) -> None:
    """Queue an already published row again (same bytes, same message id)."""
    await conn.execute("UPDATE outbox SET published_at = NULL WHERE message_id = $1", message_id)
