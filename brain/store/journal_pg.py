"""The journal on PostgreSQL: an entry in one statement with its seq, many sessions' entries in
one read, and the journal entries of a statement that moves many turns at once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from brain.rules.records import Entry
from brain.store.journal import Journal
from brain.store.sql import JOURNAL_COLUMNS, qualified
from infra.db import Connection

# The journal entries of a statement's ``entry`` CTE (turn_id, session_id, thread_id, run, status,
# phase, facts, and its nth of n in its session): each session's seq bumped once by n, the
# entries numbered in order after its last one. Returns (turn_id, seq) as ``written``.
#
# By whether the entries may span sessions: then the bump walks them in id order (the sessions
# a batch of submits locks are locked in that order too: brain/store/submits_pg.py). The plan
# PostgreSQL makes for it, a nested loop over the sorted entries, locks each session as it comes;
# walked in the order of a hash of their ids, two batches that share sessions, one in each order,
# would each hold one the other waits for until the deadlock check (a second) failed one, which
# ``transact`` tries again. Locking them first, in a step of its own, cost about 6 % of the calls
# at 50 in flight (a row locked is a row written). One session has no order to keep.
_JOURNAL_ENTRIES = """bump AS (
    UPDATE sessions s SET last_seq = s.last_seq + e.n
      FROM ({sessions}) AS e WHERE s.id = e.session_id
 RETURNING s.id, s.last_seq),
written AS (
    INSERT INTO journal (session_id, seq, thread_id, turn_id, run, status, phase, facts)
    SELECT e.session_id, b.last_seq - e.n + e.nth, e.thread_id, e.turn_id, e.run, e.status, e.phase, e.facts
      FROM entry e JOIN bump b ON b.id = e.session_id
 RETURNING turn_id, seq)"""
JOURNAL_ENTRIES = {
    False: _JOURNAL_ENTRIES.format(sessions="SELECT DISTINCT session_id, n FROM entry"),
    True: _JOURNAL_ENTRIES.format(
        sessions="SELECT DISTINCT ON (session_id) session_id, n FROM entry ORDER BY session_id"
    ),
}  # by whether the entries may span sessions

_APPEND = """
WITH bump AS (UPDATE sessions SET last_seq = last_seq + 1 WHERE id = $1 RETURNING last_seq)
INSERT INTO journal (session_id, seq, thread_id, turn_id, run, status, phase, facts)
SELECT $1, last_seq, $2, $3, $4, $5, $6, $7 FROM bump RETURNING seq"""

_SESSIONS_ENTRIES = f"""
SELECT {qualified("j", JOURNAL_COLUMNS)}
  FROM unnest($1::text[], $2::bigint[]) AS a(session_id, seq)
  JOIN journal j ON j.session_id = a.session_id AND j.seq > a.seq
 ORDER BY j.session_id, j.seq"""


class PgJournal(Journal):
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
        return int(
            await conn.fetchval(
                _APPEND, session_id, thread_id or session_id, turn_id, run, status, phase, facts
            )
        )

    async def sessions_entries(self, conn: Connection, after: Mapping[str, int]) -> dict[str, list[Entry]]:
        found: dict[str, list[Entry]] = {session: [] for session in after}
        for r in await conn.fetch(_SESSIONS_ENTRIES, list(after), list(after.values())):
            found[r["session_id"]].append(Entry.from_record(r))
        return found
