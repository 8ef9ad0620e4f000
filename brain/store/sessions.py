"""Sessions and their threads as users see them: listing sessions, threads and turns (with each
turn's agent and input), closing a thread or a session once nothing in it is left unfinished."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from brain.rules.agents import AgentDefinition
from brain.store.part import Part
from brain.store.sql import TERMINAL_SQL
from infra.db import Connection, Row
from protocol import IllegalTransitionError, NotFoundError

# A session as its list shows it: its counts and its latest turn (read with ``turns_by_id``). Its
# ``id`` is the store's key of it, ``namespace/session id`` (``brain.rules.submits.session_key``).
_SESSION = f"""SELECT s.id, s.created_at, s.closed_at,
       (SELECT count(*) FROM threads th WHERE th.session_id = s.id) AS threads,
       (SELECT count(*) FROM turns t WHERE t.session_id = s.id) AS turns,
       (SELECT count(*) FROM turns t
         WHERE t.session_id = s.id AND t.status NOT IN {TERMINAL_SQL}) AS unfinished,
       (SELECT t.id FROM turns t WHERE t.session_id = s.id ORDER BY t.seq DESC LIMIT 1) AS last_turn
  FROM sessions s WHERE s.namespace = $1"""
# What a search matches: a part of the session's id (its key without the namespace), of the name
# of an agent one of its threads runs, of the request id of one of its turns, or of its metadata
# as ``key=value`` (case-insensitive; ``{p}``: a LIKE pattern).
_SEARCH = """ AND (lower(substr(s.id, length(s.namespace) + 2)) LIKE {p} ESCAPE '!'
       OR EXISTS (SELECT 1 FROM threads th
                   WHERE th.session_id = s.id AND lower(th.agent_name) LIKE {p} ESCAPE '!')
       OR EXISTS (SELECT 1 FROM turns t
                   WHERE t.session_id = s.id AND lower(t.request_id) LIKE {p} ESCAPE '!')
       OR EXISTS (SELECT 1 FROM metadata m WHERE m.scope = 'session' AND m.id = s.id
                     AND lower(m.key || '=' || m.value) LIKE {p} ESCAPE '!'))"""
_TURN = """SELECT t.id, t.seq, t.session_id, t.thread_id, th.name AS thread, th.agent_name, th.agent_version,
       t.request_id, t.status, t.phase, t.waiting_for, t.revision, t.created_at, t.updated_at
  FROM turns t JOIN threads th ON th.id = t.thread_id"""


def like_pattern(text: str) -> str:
    """``text`` as a case-insensitive LIKE pattern (escaped with ``!``) that matches it anywhere,
    its own ``%`` and ``_`` taken as they are."""
    escaped = text.lower().replace("!", "!!").replace("%", "!%").replace("_", "!_")
    return f"%{escaped}%"


class Sessions(Part):
    async def session(self, conn: Connection, namespace: str, session_id: str) -> Row | None:
        """The session of that key, if it is ``namespace``'s (None otherwise)."""
        return await conn.fetchrow(
            "SELECT id, namespace, last_seq, closed_at FROM sessions WHERE id = $1 AND namespace = $2",
            session_id,
            namespace,
        )

    async def add_session(self, conn: Connection, namespace: str, key: str) -> bool:
        """A session before its first turn (a copy's, a LangGraph thread's); False when its key is
        taken."""
        done = await conn.fetchval(
            "INSERT INTO sessions (id, namespace) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING id",
            key,
            namespace,
        )
        return done is not None

    async def threads_of(self, conn: Connection, session_id: str) -> list[Row]:
        """A session's threads with how many of their turns are in each status."""
        return list(
            await conn.fetch(
                f"""SELECT th.id, th.name, th.agent_name, th.agent_version, th.created_at, th.closed_at,
                           th.forked_from, th.forked_at, count(t.id) AS turns,
                           count(t.id) FILTER (WHERE t.status NOT IN {TERMINAL_SQL}) AS unfinished
                      FROM threads th LEFT JOIN turns t ON t.thread_id = th.id
                     WHERE th.session_id = $1
                     GROUP BY th.id, th.name, th.agent_name, th.agent_version, th.created_at, th.closed_at,
                              th.forked_from, th.forked_at
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
                f"""{_TURN}
                    WHERE t.session_id = $1 AND (CAST($2 AS text) IS NULL OR t.thread_id = $2)
                      AND (CAST($3 AS text) IS NULL OR t.status = $3) AND t.seq > $4
                    ORDER BY t.seq LIMIT $5""",
                session_id,
                thread_id,
                status,
                after,
                limit,
            )
        )

    async def sessions_of(
        self,
        conn: Connection,
        namespace: str,
        *,
        search: str | None,
        limit: int,
        before: tuple[datetime, str] | None,
    ) -> list[Row]:
        """A namespace's sessions, newest first: a page of ``limit`` after ``before`` (the time
        and id of the last session of the page before), those ``search`` matches (``_SEARCH``)."""
        sql = _SESSION
        args: list[object] = [namespace]  # parameters, numbered in the order they are added
        if search:
            args.append(like_pattern(search))
            sql += _SEARCH.format(p=f"${len(args)}")
        if before is not None:
            at, key = f"${len(args) + 1}", f"${len(args) + 2}"
            args += [before[0], before[1]]
            sql += f" AND (s.created_at < {at} OR (s.created_at = {at} AND s.id < {key}))"
        sql += f" ORDER BY s.created_at DESC, s.id DESC LIMIT ${len(args) + 1}"
        return list(await conn.fetch(sql, *args, limit))

    async def turns_by_id(self, conn: Connection, turn_ids: Sequence[str]) -> list[Row]:
        """Turns as their lists show them (with their thread's agent), by id."""
        found = []
        for turn_id in turn_ids:
            row = await conn.fetchrow(f"{_TURN} WHERE t.id = $1", turn_id)
            if row is not None:
                found.append(row)
        return found

    async def inputs(self, conn: Connection, session_id: str, turn_ids: Sequence[str]) -> dict[str, str]:
        """The input of each of ``turn_ids`` (turns of ``session_id``), read from the journal's
        ``turn.accepted`` facts (the turn's row keeps only its digest)."""
        if not turn_ids:
            return {}
        marks = ", ".join(f"${i + 2}" for i in range(len(turn_ids)))
        rows = await conn.fetch(
            f"""SELECT turn_id, facts FROM journal
                 WHERE session_id = $1 AND turn_id IN ({marks})
                   AND CAST(facts AS text) LIKE '%turn.accepted%' ORDER BY seq""",
            session_id,
            *turn_ids,
        )
        found: dict[str, str] = {}
        for r in rows:
            for fact in r["facts"]:
                if fact.get("kind") == "turn.accepted" and r["turn_id"] not in found:
                    found[r["turn_id"]] = str((fact.get("input") or {}).get("text", ""))
        return found

    async def repin_thread(
        self, conn: Connection, namespace: str, thread_id: str, agent: AgentDefinition
    ) -> bool:
        """Move a thread of ``namespace`` from another version of ``agent``'s name to ``agent``
        (registered here if new), its tool bindings to be frozen again by its next turn: only while
        it is open and no turn of it is unfinished. True when it moved."""
        await conn.execute(
            """INSERT INTO agents (namespace, name, version, digest, definition) VALUES ($1, $2, $3, $4, $5)
               ON CONFLICT DO NOTHING""",
            namespace,
            agent.name,
            agent.version,
            agent.digest,
            agent.stored,
        )
        moved = await conn.fetchval(
            f"""UPDATE threads SET agent_version = $3, bindings = NULL
                 WHERE id = $1 AND agent_name = $2 AND agent_version <> $3 AND closed_at IS NULL
                   AND EXISTS (SELECT 1 FROM sessions s
                                WHERE s.id = threads.session_id AND s.namespace = $4)
                   AND NOT EXISTS (SELECT 1 FROM turns t
                                    WHERE t.thread_id = $1 AND t.status NOT IN {TERMINAL_SQL})
             RETURNING id""",
            thread_id,
            agent.name,
            agent.version,
            namespace,
        )
        return moved is not None

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

    async def close_session(self, conn: Connection, session_id: str, what: str) -> bool:
        """Close a session (by its key) and every thread of it (True), or say it was closed already
        (False); refused while a turn of it is unfinished."""
        row = await conn.fetchrow(
            f"SELECT closed_at FROM sessions WHERE id = $1{self.store.FOR_UPDATE}", session_id
        )
        if row is None:
            raise NotFoundError(f"there is no {what}")
        if row["closed_at"] is not None:
            return False
        unfinished = await _unfinished(conn, "session_id", session_id)
        if unfinished:
            raise IllegalTransitionError(
                f"{what} has {unfinished} unfinished turn(s): wait for them or cancel them first"
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
