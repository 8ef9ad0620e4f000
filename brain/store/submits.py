"""Submits: a turn accepted durably, once per request id, on a thread pinned to its agent's
version; and a submit a Brain serves, which may start the turn's run in the same commit.

The rules that decide a submit from what it found are ``brain.rules.submits``; the portable
statements are here, and ``submits_pg`` makes the submits of many sessions one statement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from brain.rules.doubletext import check_busy
from brain.rules.records import TurnRow
from brain.rules.submits import (
    Start,
    Submit,
    Submitted,
    check_submit,
    frozen_by,
    raised,
    starts_now,
    submit_facts,
)
from brain.store.bindings import mark_of
from brain.store.part import Part
from brain.store.sql import TERMINAL_SQL, TURN_COLUMNS, owner_not_dead
from infra.db import Connection
from protocol import ConflictError, IllegalTransitionError, TendonError, new_id

# One read for what a submit checks: the request id, the agent, the session and the thread ($6),
# all of the submit's namespace ($1; $2 is the session's key, which holds it too).
# ``thread_open`` and ``thread_bound`` say whether a served submit may start the turn at once.
KNOWN_SQL = f"""SELECT t.id AS turn_id, t.input_digest, t.thread_id AS turn_thread, a.digest AS agent_digest,
                      s.namespace AS session_ns, s.closed_at AS session_closed, th.agent_name,
                      th.agent_version, th.closed_at AS thread_closed,
                      th.bindings IS NOT NULL AS thread_bound,
                      (SELECT count(*) FROM turns o
                        WHERE o.thread_id = $6 AND o.status NOT IN {TERMINAL_SQL}) AS thread_open
                 FROM (SELECT 1 AS one) AS here
                 LEFT JOIN turns t ON t.namespace = $1 AND t.session_id = $2 AND t.request_id = $3
                 LEFT JOIN agents a ON a.namespace = $1 AND a.name = $4 AND a.version = $5
                 LEFT JOIN sessions s ON s.id = $2
                 LEFT JOIN threads th ON th.id = $6"""


class Submits(Part):
    async def submit(self, submit: Submit) -> tuple[str, bool]:
        """Accept a turn durably; returns (turn id, created now). See ``brain.verbs.sessions.submit``."""

        async def work(conn: Connection) -> Submitted:
            return await self.submit_in(conn, submit, None)

        done = await self.store.transact(work, single_statement=True, read_then_insert=True)
        return done.turn_id, done.created

    async def submit_served(self, s: Submit, start: Start) -> Submitted:
        """A submit that starts the turn's run at once when its thread is idle (``start``), alone:
        what ``brain.run.claims.Served`` does for the submits that arrive together
        (:meth:`submit_batch`). A refusal raises."""
        items = [(s, start)]
        (done,) = await self.store.transact(
            lambda conn: self.submit_batch(conn, items),
            single_statement=self.submits_in_one_statement(items), read_then_insert=True,
        )  # fmt: skip
        return raised(done)

    def submits_in_one_statement(self, items: Sequence[tuple[Submit, Start | None]]) -> bool:
        """Whether :meth:`submit_batch` writes ``items`` with one statement (which then commits
        on its own where the backend allows it)."""
        return False

    async def submit_batch(
        self, conn: Connection, items: Sequence[tuple[Submit, Start | None]]
    ) -> list[Submitted | TendonError]:
        """The submits of ``items`` in the caller's transaction (a served one, with its ``Start``,
        on its thread's lock), each with its own outcome: one that its checks refuse is that
        item's error, and the others go on (the checks refuse before anything is written)."""
        done: list[Submitted | TendonError] = []
        for s, start in items:
            if start is not None:
                await self.lock_thread(conn, s.thread_id)
            try:
                done.append(await self.submit_in(conn, s, start))
            except (ConflictError, IllegalTransitionError) as exc:
                done.append(exc)
        return done

    async def lock_thread(self, conn: Connection, thread_id: str) -> None:
        """Lock the thread (if it is there) until the caller's transaction ends (on SQLite, which
        runs one write transaction at a time, the transaction is the lock)."""
        await conn.fetchrow(f"SELECT id FROM threads WHERE id = $1{self.store.FOR_UPDATE}", thread_id)

    async def _still_announced(self, conn: Connection, known: Mapping[str, Any], start: Start) -> bool:
        """Whether the announcements a new thread's offered bindings were chosen from are still
        those (an existing thread keeps its own: nothing to check)."""
        if start.announced is None or known["agent_name"] is not None:
            return True
        tools, mark = start.announced
        return mark_of(await self.store.bindings.binding_rows(conn, tools)) == mark

    async def submit_in(self, conn: Connection, s: Submit, start: Start | None) -> Submitted:
        """A submit inside the caller's transaction, which starts the turn's run when ``start``
        offers it and the thread is idle (what ``submit_served`` does, given the thread's lock)."""
        agent = s.agent
        known = await conn.fetchrow(
            KNOWN_SQL, s.namespace, s.session_key, s.request_id, agent.name, agent.version, s.thread_id
        )
        assert known is not None  # its FROM is one row, whatever it finds
        existing = check_submit(
            known, namespace=s.namespace, session_id=s.session_id, thread=s.thread, request_id=s.request_id,
            input_digest=s.input_digest, agent=agent,
        )  # fmt: skip
        if existing is not None:
            return Submitted(existing, False)
        check_busy(known, s.strategy, s.where)
        stale = start is not None and not await self._still_announced(conn, known, start)
        if start is not None and (stale or not starts_now(known, start)):
            start = None
        if start is not None and not await conn.fetchval(f"SELECT {owner_not_dead('$1')}", start.owner):
            start = None  # a Brain presumed dead starts no turn: it is queued for the others
        if known["agent_digest"] is None:
            await conn.execute(
                "INSERT INTO agents (namespace, name, version, digest, definition)"
                " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                s.namespace,
                agent.name,
                agent.version,
                agent.digest,
                agent.stored,
            )
        if known["session_ns"] is None:
            await conn.execute(
                "INSERT INTO sessions (id, namespace) VALUES ($1, $2)", s.session_key, s.namespace
            )
        if known["agent_name"] is None:
            await conn.execute(
                "INSERT INTO threads (id, session_id, name, agent_name, agent_version, bindings)"
                " VALUES ($1, $2, $3, $4, $5, $6)",
                s.thread_id, s.session_key, s.thread, agent.name, agent.version,
                start.bindings if start is not None else None,
            )  # fmt: skip
        turn_id = f"turn-{new_id()}"
        status, phase = ("running", "model_request") if start is not None else ("queued", "prepare")
        await conn.execute(
            """INSERT INTO turns (id, namespace, session_id, thread_id, request_id, input_digest, status,
                                 phase, lease_owner, lease_epoch, runs, lease_expires_at)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, ts_add(now(), $11))""",
            turn_id, s.namespace, s.session_key, s.thread_id, s.request_id, s.input_digest, status, phase,
            start.owner if start else None, 1 if start else 0, start.lease_seconds if start else None,
        )  # fmt: skip
        said = submit_facts(s, start)
        seq = await self.store.journal.append(
            conn, s.session_key, turn_id, said, thread_id=s.thread_id, status=status, phase=phase
        )
        if start is None:
            await conn.execute("SELECT pg_notify($1, '')", s.wake_channel)
            return Submitted(turn_id, True, stale=stale)
        row = await conn.fetchrow(f"SELECT {TURN_COLUMNS} FROM turns WHERE id = $1", turn_id)
        assert row is not None  # inserted in this transaction
        return Submitted(turn_id, True, TurnRow.from_record(row), seq, said, frozen_by(known, start))
