"""The controls outbox: cancels and other controls for the Hands, committed with the change that
decided them and published after the commit (``brain.run.relay.ControlRelay``), again until the
broker confirmed them."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from brain.rules.records import Control
from brain.store.part import Part
from infra.db import Connection
from protocol import encode


class Outbox(Part):
    async def add_control(self, conn: Connection, queue: str, control: Any) -> Control:
        payload = encode(control)
        outbox_id = await conn.fetchval(
            "INSERT INTO outbox (queue, message_id, payload) VALUES ($1, $2, $3) RETURNING id",
            queue,
            control.message_id,
            payload,
        )
        return Control(queue, control.message_id, payload, outbox_id)

    async def unpublished_controls(self, conn: Connection, limit: int = 200) -> list[Control]:
        rows = await conn.fetch(
            "SELECT id, queue, message_id, payload FROM outbox WHERE published_at IS NULL"
            " ORDER BY id LIMIT $1",
            limit,
        )
        return [Control(r["queue"], r["message_id"], bytes(r["payload"]), r["id"]) for r in rows]

    async def controls_published(self, conn: Connection, ids: Collection[int]) -> None:
        for outbox_id in ids:
            await conn.execute("UPDATE outbox SET published_at = now() WHERE id = $1", outbox_id)
