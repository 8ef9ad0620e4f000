"""Tool bindings as Hands pools announce them, and what a thread is bound to: the threads and
agent definitions a run reads before it calls the model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from brain.store.turns import TurnRows


class BindingRows(TurnRows):
    async def store_bindings(self, conn: Any, bindings: Sequence[Any], wake_channel: str) -> None:
        for b in bindings:
            await conn.execute(
                """INSERT INTO bindings (route, name, digest, binding) VALUES ($1, $2, $3, $4)
                   ON CONFLICT (route, name, digest) DO UPDATE SET announced_at = now()""",
                b.route,
                b.name,
                b.digest,
                b.model_dump(mode="json"),
            )
        await self.wake_for_bindings(conn, wake_channel)

    async def latest_bindings(self, conn: Any, tools: Sequence[str]) -> dict[str, Any]:
        """The most recently announced binding of each tool."""
        found: dict[str, tuple[Any, Any]] = {}
        for name in tools:
            for r in await conn.fetch(
                "SELECT binding, announced_at FROM bindings WHERE name = $1 ORDER BY announced_at", name
            ):
                found[name] = (r["announced_at"], r["binding"])  # later rows win
        return {name: binding for name, (_, binding) in found.items()}

    async def bound_routes(self, tools: Sequence[str]) -> list[tuple[str, str]]:
        """(tool, route) of every announced binding of ``tools``."""

        async def work(conn: Any) -> list[tuple[str, str]]:
            pairs = set()
            for name in tools:
                for r in await conn.fetch("SELECT DISTINCT route FROM bindings WHERE name = $1", name):
                    pairs.add((name, r["route"]))
            return sorted(pairs)

        return await self.read(work)

    async def thread(self, conn: Any, thread_id: str) -> Any:
        return await conn.fetchrow("SELECT * FROM threads WHERE id = $1", thread_id)

    async def agent_definition(self, conn: Any, name: str, version: str) -> Any:
        return await conn.fetchval(
            "SELECT definition FROM agents WHERE name = $1 AND version = $2", name, version
        )
