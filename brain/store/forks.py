"""Forks and rewinds of threads (``brain.rules.forks`` says what they keep): a fork's thread row,
which keeps its lineage (the thread it was forked from and the seq it was cut at), and what a
cut reads. A copy is a fork into a new session: its main thread, keeping the same lineage."""

from __future__ import annotations

from brain.rules.records import Entry
from brain.store.part import Part
from brain.store.sql import TERMINAL_SQL
from infra.db import Connection, Row

_THREAD = """SELECT th.id, th.session_id, th.name, th.agent_name, th.agent_version, th.bindings, th.closed_at,
       th.forked_from, th.forked_at, s.closed_at AS session_closed_at
  FROM threads th JOIN sessions s ON s.id = th.session_id
 WHERE th.id = $1 AND s.namespace = $2"""


class Forks(Part):
    async def thread(
        self, conn: Connection, namespace: str, thread_id: str, *, lock: bool = False
    ) -> Row | None:
        """The thread of that id if it is ``namespace``'s (None otherwise); ``lock``: for update,
        so that no submit starts a turn in it before the caller's transaction ends."""
        locked = f"{self.store.FOR_UPDATE} OF th" if lock and self.store.FOR_UPDATE else ""  # not its session
        return await conn.fetchrow(_THREAD + locked, thread_id, namespace)

    async def unfinished(self, conn: Connection, thread_id: str) -> int:
        """How many turns of the thread are unfinished (a statement of its own after the lock, as
        ``Sessions.close_thread`` counts them)."""
        return int(
            await conn.fetchval(
                f"SELECT count(*) FROM turns WHERE thread_id = $1 AND status NOT IN {TERMINAL_SQL}", thread_id
            )
        )

    async def entries(self, conn: Connection, session_id: str, thread_id: str, at: int) -> list[Entry]:
        """The thread's journal entries up to seq ``at``, in order."""
        return [
            e
            for e in await self.store.journal.events(
                conn, session_id, after=0, limit=1_000_000, thread_id=thread_id
            )
            if e.seq <= at
        ]

    async def create(
        self, conn: Connection, parent: Row, thread_id: str, name: str, at: int, *, session: str | None = None
    ) -> None:
        """The fork's thread: the parent's session (or ``session``, a copy's), agent version and
        frozen bindings, and its lineage."""
        await conn.execute(
            """INSERT INTO threads (id, session_id, name, agent_name, agent_version, bindings, forked_from,
                                    forked_at)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8)""",
            thread_id, session or parent["session_id"], name, parent["agent_name"],
            parent["agent_version"], parent["bindings"], parent["id"], at,
        )  # fmt: skip
