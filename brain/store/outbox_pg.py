"""The controls outbox on PostgreSQL: many published at once in one statement."""

from __future__ import annotations

from collections.abc import Collection

from brain.store.outbox import Outbox
from infra.db import Connection


class PgOutbox(Outbox):
    async def controls_published(self, conn: Connection, ids: Collection[int]) -> None:
        await conn.execute("UPDATE outbox SET published_at = now() WHERE id = ANY($1::bigint[])", list(ids))
