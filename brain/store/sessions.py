"""Sessions and their threads as users see them: listing threads and turns, closing a thread or a
session once nothing in it is left unfinished."""

from __future__ import annotations

from brain.store.part import Part
from brain.store.sql import TERMINAL_SQL
from infra.db import Connection, Row
from protocol import IllegalTransitionError, NotFoundError


class Sessions(Part):
    async def session(self, conn: Connection, namespace: str, session_id: str) -> Row | None:
        """The session, if it is ``namespace``'s (None otherwise: another tenant's is not there)."""
        return await conn.fetchrow(
            "SELECT id, namespace, last_seq, closed_at FROM sessions WHERE id = $1 AND namespace = $2",
            session_id,
            namespace,
        )

    async def threads_of(self, conn: Connection, session_id: str) -> list[Row]:
        """A session's threads with how many of their turns are in each status."""
        return list(
            await conn.fetch(
                f"""SELECT th.id, th.name, th.agent_name, th.agent_version, th.created_at, th.closed_at,
                           count(t.id) AS turns,
                           count(t.id) FILTER (WHERE t.status NOT IN {TERMINAL_SQL}) AS unfinished
                      FROM threads th LEFT JOIN turns t ON t.thread_id = th.id
                     WHERE th.session_id = $1
                     GROUP BY th.id, th.name, th.agent_name, th.agent_version, th.created_at, th.closed_at
                     ORDER BY th.created_at, th.id""",
                session_id,
            )
        )

    async def turns_of(
        self,
        conn: Connection,
        session_id: str,
        thread_id: str | None,
        status: str | None,
        limit: int,
        after: int,
    ) -> list[Row]:
        """A session's turns in accepted order (of one thread, in one status), after ``after`` (a
        turn's ``seq``: the page before ended there)."""
        return list(
            await conn.fetch(
                """SELECT id, seq, thread_id, request_id, status, phase, waiting_for, revision, created_at,
                          updated_at
                     FROM turns
                    WHERE session_id = $1 AND (CAST($2 AS text) IS NULL OR thread_id = $2)
                      AND (CAST($3 AS text) IS NULL OR status = $3) AND seq > $4
                    ORDER BY seq LIMIT $5""",
                session_id,
                thread_id,
                status,
                after,
                limit,
            )
        )

    async def close_thread(self, conn: Connection, thread_id: str, what: str) -> bool:
        """Close a thread (True), or say that it was closed already (False); refused while a turn
        of it is unfinished."""
        row = await conn.fetchrow(
            f"SELECT closed_at FROM threads WHERE id = $1{self.store.FOR_UPDATE}", thread_id
        )
        if row is None:
            raise NotFoundError(f"there is no {what}")
        if row["closed_at"] is not None:
            return False
        unfinished = await _unfinished(conn, "thread_id", thread_id)
        if unfinished:
            raise IllegalTransitionError(
                f"{what} has {unfinished} unfinished turn(s): wait for them or cancel them first"
            )
        await conn.execute("UPDATE threads SET closed_at = now() WHERE id = $1", thread_id)
        return True

    async def close_session(self, conn: Connection, session_id: str) -> bool:
        """Close a session and every thread of it (True), or say it was closed already (False);
        refused while a turn of it is unfinished."""
        row = await conn.fetchrow(
            f"SELECT closed_at FROM sessions WHERE id = $1{self.store.FOR_UPDATE}", session_id
        )
        if row is None:
            raise NotFoundError(f"there is no session {session_id!r}")
        if row["closed_at"] is not None:
            return False
        unfinished = await _unfinished(conn, "session_id", session_id)
        if unfinished:
            raise IllegalTransitionError(
                f"session {session_id!r} has {unfinished} unfinished turn(s): wait for them or "
                "cancel them first"
            )
        await conn.execute("UPDATE sessions SET closed_at = now() WHERE id = $1", session_id)
        await conn.execute(
            "UPDATE threads SET closed_at = now() WHERE session_id = $1 AND closed_at IS NULL", session_id
        )
        return True


async def _unfinished(conn: Connection, column: str, value: str) -> int:
    """How many turns of the thread or session (``column``: thread_id or session_id) are
    unfinished. Counted by a statement of its own, after the caller locked that row: a statement
    that took the lock first (a served submit) may have started a turn, which the locking
    statement's own snapshot would miss."""
    return int(
        await conn.fetchval(
            f"SELECT count(*) FROM turns WHERE {column} = $1 AND status NOT IN {TERMINAL_SQL}", value
        )
    )
