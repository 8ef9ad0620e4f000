"""Tool bindings as Hands pools announce them, and what a thread is bound to: the threads and
agent definitions a run reads before it calls the model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from brain.rules.submits import Mark
from brain.store.part import Part
from infra.db import Connection, Row
from infra.db.store import as_time
from protocol import is_content_version, version_key

# Announcements this close to a tool's latest one count as the same: a pool announces each of
# its versions of a tool together, and pools of one deployment start within moments.
ANNOUNCED_TOGETHER = 60.0


def mark_of(rows: Sequence[Mapping[str, Any]]) -> Mark:
    """The mark of announcement rows (``announced_at`` of each)."""
    return len(rows), max((as_time(r["announced_at"]) for r in rows), default=None)


def newest(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """For each tool of ``rows`` (name, binding, announced_at): the newest version among those
    announced with its latest announcement. An upgrade that serves versions 1 and 2 side by side
    gives new threads version 2, while threads pinned to 1 keep it (a pure rule). Between two
    content versions (digests of the tool's definition: ``protocol.is_content_version``), the later
    announcement is the newer (the definition that replaced the other)."""
    latest: dict[str, Any] = {}
    for r in rows:
        at = as_time(r["announced_at"])
        if r["name"] not in latest or at > latest[r["name"]]:
            latest[r["name"]] = at
    chosen: dict[str, Mapping[str, Any]] = {}
    for r in rows:
        name = r["name"]
        if (latest[name] - as_time(r["announced_at"])).total_seconds() > ANNOUNCED_TOGETHER:
            continue
        if name not in chosen or _newer(r, chosen[name]):
            chosen[name] = r
    return {name: r["binding"] for name, r in chosen.items()}


def _newer(row: Mapping[str, Any], than: Mapping[str, Any]) -> bool:
    mine, theirs = row["binding"]["version"], than["binding"]["version"]
    if is_content_version(mine) and is_content_version(theirs):
        return as_time(row["announced_at"]) > as_time(than["announced_at"])
    return version_key(mine) > version_key(theirs)


# A thread's row with its session's namespace.
THREAD_SQL = "SELECT th.*, s.namespace FROM threads th JOIN sessions s ON s.id = th.session_id"


class Bindings(Part):
    async def store_bindings(self, conn: Connection, bindings: Sequence[Any], wake_channel: str) -> None:
        for b in bindings:
            await conn.execute(
                """INSERT INTO bindings (route, name, digest, binding) VALUES ($1, $2, $3, $4)
                   ON CONFLICT (route, name, digest) DO UPDATE SET announced_at = now()""",
                b.route,
                b.name,
                b.digest,
                b.model_dump(mode="json"),
            )
        await self.store.turns.wake_for_bindings(conn, wake_channel)

    async def binding_rows(self, conn: Connection, tools: Sequence[str]) -> list[Row]:
        """The announcements of ``tools`` (``name``, ``binding``, ``announced_at``: a row per pool
        and version; one statement where the backend can)."""
        rows: list[Row] = []
        for name in tools:
            rows += await conn.fetch("SELECT name, binding, announced_at FROM bindings WHERE name = $1", name)
        return rows

    async def latest_bindings(self, conn: Connection, tools: Sequence[str]) -> dict[str, Any]:
        """The binding of each tool a new thread freezes (see :func:`newest`)."""
        return newest(await self.binding_rows(conn, tools))

    async def marked_bindings(self, conn: Connection, tools: Sequence[str]) -> tuple[dict[str, Any], Mark]:
        """``latest_bindings``, with the mark of the announcements they were chosen from."""
        rows = await self.binding_rows(conn, tools)
        return newest(rows), mark_of(rows)

    async def bound_routes(self, tools: Sequence[str]) -> list[tuple[str, str]]:
        """(tool, route) of every announced binding of ``tools``."""

        async def work(conn: Connection) -> list[tuple[str, str]]:
            pairs = set()
            for name in tools:
                for r in await conn.fetch("SELECT DISTINCT route FROM bindings WHERE name = $1", name):
                    pairs.add((name, r["route"]))
            return sorted(pairs)

        return await self.store.read(work)

    async def routes(self, conn: Connection) -> list[Row]:
        """Every route a Hands pool announced tools for: each tool's name and the last time one was
        announced (a pool announces when it starts)."""
        return list(
            await conn.fetch(
                """SELECT route, name, max(announced_at) AS announced_at FROM bindings
                    GROUP BY route, name ORDER BY route, name"""
            )
        )

    async def thread(self, conn: Connection, thread_id: str) -> Row | None:
        """A thread's row, with its session's namespace (whose agents it runs)."""
        return await conn.fetchrow(f"{THREAD_SQL} WHERE th.id = $1", thread_id)

    async def threads(self, conn: Connection, thread_ids: Sequence[str]) -> list[Row]:
        """The rows of ``thread_ids`` that exist (one statement where the backend can)."""
        found = [await self.thread(conn, t) for t in thread_ids]
        return [r for r in found if r is not None]

    async def agent_definition(self, conn: Connection, namespace: str, name: str, version: str) -> Any:
        """The stored definition of ``namespace``'s agent ``name`` at ``version`` (agents are
        registered per namespace: another's of the same name and version is another agent)."""
        return await conn.fetchval(
            "SELECT definition FROM agents WHERE namespace = $1 AND name = $2 AND version = $3",
            namespace,
            name,
            version,
        )
