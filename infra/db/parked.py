"""The ``parked`` table both stores keep: the statements on it (:class:`ParkedRows`, mixed into
each component's store) and the reads that list and show what is in it.

What the broker parks is read back and recorded by ``infra.transport.parked``; the ``parked``
commands show it (:func:`show_parked`, in the words of ``infra.process.cli``) and the Brain's
operator API lists it.
"""

from __future__ import annotations

import json
from typing import Any

from infra.db.connection import Connection
from infra.process.cli import render_listing, render_one
from protocol import NotFoundError


class ParkedRows:
    """The statements on a component's ``parked`` table; mixed into its store."""

    async def record_parked(self, conn: Connection, **row: Any) -> None:
        await conn.execute(
            """INSERT INTO parked (queue, message_id, reason, headers, body, kind, execution_id, surfaced)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8)""",
            row["queue"],
            row["message_id"],
            row["reason"],
            row["headers"],
            row["body"],
            row["kind"],
            row["execution_id"],
            row["surfaced"],
        )

    async def parked_listing(self, conn: Connection, limit: int) -> list[Any]:
        return list(
            await conn.fetch(
                """SELECT id, parked_at, queue, message_id, kind, execution_id, reason, surfaced
                     FROM parked ORDER BY id DESC LIMIT $1""",
                limit,
            )
        )

    async def parked_one(self, conn: Connection, parked_id: int) -> Any:
        return await conn.fetchrow("SELECT * FROM parked WHERE id = $1", parked_id)

    async def prune_parked(self, conn: Connection, horizon_seconds: float, limit: int) -> int:
        """Delete up to ``limit`` parked messages recorded ``horizon_seconds`` ago or more (what
        they did to their turn or execution was done when they were recorded)."""
        gone = await conn.fetch(
            """DELETE FROM parked WHERE id IN (
                   SELECT id FROM parked WHERE parked_at < ts_add(now(), $1) ORDER BY id LIMIT $2)
               RETURNING id""",
            -horizon_seconds,
            limit,
        )
        return len(gone)


async def listing(store: Any, limit: int = 50) -> list[dict[str, Any]]:
    """The latest parked messages, newest first, without their bodies."""
    rows = await store.read(lambda c: store.parked_listing(c, limit))
    return [{**dict(r), "parked_at": r["parked_at"].isoformat()} for r in rows]


async def one(store: Any, parked_id: int) -> dict[str, Any] | None:
    """One parked message with its headers and body (as text when it is UTF-8)."""
    row = await store.read(lambda c: store.parked_one(c, parked_id))
    if row is None:
        return None
    body = bytes(row["body"])
    try:
        text: str | None = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {
        **{k: row[k] for k in ("id", "queue", "message_id", "kind", "execution_id", "reason", "surfaced")},
        "headers": row["headers"],
        "parked_at": row["parked_at"].isoformat(),
        "body": text if text is not None else body.hex(),
        "body_encoding": "utf-8" if text is not None else "hex",
    }


async def show_parked(store: Any, parked_id: int | None, *, limit: int, as_json: bool) -> int:
    """What ``brain parked`` and ``hands parked`` print; raises NotFoundError for an unknown id."""
    if parked_id is None:
        rows = await listing(store, limit)
        print(json.dumps(rows, indent=2, default=str) if as_json else render_listing(rows))
        return 0
    row = await one(store, parked_id)
    if row is None:
        raise NotFoundError(f"no parked message #{parked_id}")
    print(json.dumps(row, indent=2, default=str) if as_json else render_one(row))
    return 0
