"""Bindings and threads on PostgreSQL: the rows of many tools or threads in one statement."""

from __future__ import annotations

from collections.abc import Sequence

from brain.store.bindings import THREAD_SQL, Bindings
from infra.db import Connection, Row


class PgBindings(Bindings):
    async def binding_rows(self, conn: Connection, tools: Sequence[str]) -> list[Row]:
        return list(
            await conn.fetch(
                "SELECT name, binding, announced_at FROM bindings WHERE name = ANY($1::text[])", list(tools)
            )
        )

    async def threads(self, conn: Connection, thread_ids: Sequence[str]) -> list[Row]:
        return list(await conn.fetch(f"{THREAD_SQL} WHERE th.id = ANY($1::text[])", list(thread_ids)))

    async def bound_routes(self, tools: Sequence[str]) -> list[tuple[str, str]]:
        rows = await self.store.read(
            lambda c: c.fetch(
                "SELECT DISTINCT name, route FROM bindings WHERE name = ANY($1::text[]) ORDER BY name, route",
                list(tools),
            )
        )
        return [(r["name"], r["route"]) for r in rows]
