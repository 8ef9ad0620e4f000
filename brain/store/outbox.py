"""The controls outbox: cancels and other controls for the Hands, committed with the change that
decided them and published after the commit (``brain.run.relay.ControlRelay``), again until the
broker confirmed them."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from brain.rules.records import Control
from brain.rules.submits import shown_session
from brain.store.part import Part
from infra.db import Connection
from infra.transport import Topology
from protocol import CancelBody, CancelControl, encode


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

    async def add_cancel(
        self, conn: Connection, topology: Topology, namespace: str, session_id: str,
        execution: Mapping[str, Any], reason: str,
    ) -> Control:  # fmt: skip
        """A cancel for the Hands of ``execution``'s route (its ``id``, ``route`` and
        ``request_digest``): a body that runs is asked to stop, one not started never starts, and
        a command that has not reached them leaves a tombstone that makes it a duplicate."""
        control = CancelControl(
            execution_id=execution["id"],
            namespace=namespace,
            session_id=shown_session(namespace, session_id),  # the id the Hands know (not the key)
            request_digest=execution["request_digest"],
            body=CancelBody(reason=reason),
        )
        return await self.add_control(conn, topology.controls(execution["route"]), control)

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
