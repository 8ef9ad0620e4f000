"""Metadata of sessions and threads: string pairs a submit sets (``brain.rules.metadata`` checks
them), shown with them and matched by the sessions list's search (``Sessions.sessions_of``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from brain.store.part import Part
from infra.db import Connection

SESSION, THREAD = "session", "thread"


class Metadata(Part):
    async def set(self, conn: Connection, scope: str, owner: str, pairs: Mapping[str, str]) -> None:
        """Set ``pairs`` on the session or thread ``owner`` (its key or id): a key set again takes
        its new value, keys not given stay."""
        for key, value in sorted(pairs.items()):
            await conn.execute(
                "INSERT INTO metadata (scope, id, key, value) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT (scope, id, key) DO UPDATE SET value = excluded.value",
                scope,
                owner,
                key,
                value,
            )

    async def of(self, conn: Connection, scope: str, owners: Sequence[str]) -> dict[str, dict[str, str]]:
        """The metadata of each of ``owners`` that has some, by owner."""
        found: dict[str, dict[str, str]] = {}
        for owner in owners:
            rows = await conn.fetch(
                "SELECT key, value FROM metadata WHERE scope = $1 AND id = $2 ORDER BY key", scope, owner
            )
            if rows:
                found[owner] = {r["key"]: r["value"] for r in rows}
        return found
