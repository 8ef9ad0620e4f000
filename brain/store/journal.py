"""The journal: one entry per commit that changed a turn, carrying the facts of that commit.

It is the record of a turn's runs, model calls (with their usage), tool outcomes and ending,
the conversation its thread's model sees (``brain.rules.history`` reads it back), and the ordered
stream observers follow: a per-session ``seq``, handed out by the session row, whose lock
orders a session's entries by commit so that a cursor never skips one that commits late.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from brain.rules.records import Entry
from brain.store.part import Part
from brain.store.sql import JOURNAL_COLUMNS
from infra.db import Connection

_BUMP = "UPDATE sessions SET last_seq = last_seq + 1 WHERE id = $1 RETURNING last_seq"
_INSERT = """INSERT INTO journal (session_id, seq, thread_id, turn_id, run, status, phase, facts)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"""


class Journal(Part):
    async def append(
        self,
        conn: Connection,
        session_id: str,
        turn_id: str | None,
        facts: list[dict[str, Any]],
        *,
        thread_id: str | None = None,
        run: int | None = None,
        status: str | None = None,
        phase: str | None = None,
    ) -> int:
        """One entry inside the caller's transaction; returns its seq."""
        seq: int = await conn.fetchval(_BUMP, session_id)
        await conn.execute(
            _INSERT, session_id, seq, thread_id or session_id, turn_id, run, status, phase, facts
        )
        return seq

    async def entries(
        self,
        conn: Connection,
        session_id: str,
        *,
        after: int = 0,
        limit: int = 1000,
        turn_id: str | None = None,
    ) -> list[Entry]:
        """A session's entries after seq ``after``, in order (of one turn, with ``turn_id``)."""
        if turn_id is None:
            rows = await conn.fetch(
                f"SELECT {JOURNAL_COLUMNS} FROM journal WHERE session_id = $1 AND seq > $2"
                " ORDER BY seq LIMIT $3",
                session_id,
                after,
                limit,
            )
        else:
            rows = await conn.fetch(
                f"SELECT {JOURNAL_COLUMNS} FROM journal WHERE session_id = $1 AND seq > $2 AND turn_id = $3"
                " ORDER BY seq LIMIT $4",
                session_id,
                after,
                turn_id,
                limit,
            )
        return [Entry.from_record(r) for r in rows]

    async def sessions_entries(self, conn: Connection, after: Mapping[str, int]) -> dict[str, list[Entry]]:
        """Each session's entries after its own seq in ``after``, in order (one statement where
        the backend can)."""
        return {s: await self.entries(conn, s, after=seq, limit=100_000) for s, seq in after.items()}

    async def events(
        self,
        conn: Connection,
        session_id: str,
        *,
        after: int,
        limit: int,
        thread_id: str | None = None,
        turn_id: str | None = None,
        run: int | None = None,
    ) -> list[Entry]:
        """A session's entries after seq ``after``, in order, of one thread, turn or run of a turn
        when asked (what observers follow)."""
        rows = await conn.fetch(
            f"""SELECT {JOURNAL_COLUMNS} FROM journal
                 WHERE session_id = $1 AND seq > $2 AND (CAST($3 AS text) IS NULL OR thread_id = $3)
                   AND (CAST($4 AS text) IS NULL OR turn_id = $4) AND (CAST($5 AS int) IS NULL OR run = $5)
                 ORDER BY seq LIMIT $6""",
            session_id,
            after,
            thread_id,
            turn_id,
            run,
            limit,
        )
        return [Entry.from_record(r) for r in rows]

    async def first_seq(self, conn: Connection, session_id: str) -> int:
        """The oldest seq of a session's journal still kept (retention may have pruned older ones;
        with nothing kept, the seq the next entry would have)."""
        first = await conn.fetchval(
            """SELECT coalesce((SELECT min(seq) FROM journal WHERE session_id = $1),
                               (SELECT last_seq + 1 FROM sessions WHERE id = $1), 1)""",
            session_id,
        )
        return int(first)

    async def last_seq(self, conn: Connection, session_id: str) -> int:
        return int(await conn.fetchval("SELECT last_seq FROM sessions WHERE id = $1", session_id) or 0)
