"""Submits on PostgreSQL: the submits of many sessions in one statement, each with its own checks
and outcome, so that a Brain's concurrent submits share a statement and a commit
(``brain.run.claims.Served``) and a lone one is still a single statement committed on its own."""

from __future__ import annotations

import re
from collections.abc import Sequence
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
    started_facts,
    submit_facts,
)
from brain.store.sql import TERMINAL_SQL, TURN_COLUMNS, owner_not_dead
from brain.store.submits import KNOWN_SQL, Submits
from infra.db import Connection, as_json
from infra.db.rows import row_args, rows_from
from protocol import TendonError, new_id

# A submit's values, one row each ($2 on; $1 is the wake-up channel). ``tools``, ``marked`` and
# ``marked_at``: the announcements a new thread's offered bindings were chosen from (a JSON list
# of tool names, as a row holds one value per column).
_ROW = [
    ("ord", "int"), ("ns", "text"), ("sid", "text"), ("rid", "text"), ("aname", "text"), ("aversion", "text"),
    ("tid", "text"), ("adigest", "text"), ("adef", "jsonb"), ("new_turn", "text"), ("idigest", "text"),
    ("said", "jsonb"), ("tname", "text"), ("owner", "text"), ("offered", "jsonb"), ("lease", "float8"),
    ("started", "jsonb"), ("tools", "jsonb"), ("marked", "bigint"), ("marked_at", "timestamptz"),
    ("strategy", "text"),
]  # fmt: skip

# ``KNOWN_SQL`` reads one submit's parameters; here each row's values.
_KNOWN_ARGS = ("r.ns", "r.sid", "r.rid", "r.aname", "r.aversion", "r.tid")
_KNOWN = re.sub(r"\$([1-6])\b", lambda m: _KNOWN_ARGS[int(m[1]) - 1], KNOWN_SQL)

# The submits of distinct sessions, in one statement: the checks' read, and for each row where
# nothing conflicts and the turn is new, the agent, a new session, a new thread, the turn, its
# journal entry, and one wake-up hint for all. A row with an owner starts its turn's run when
# ``starts_now`` says so (the same rule, in SQL): the turn goes in claimed and prepared, a new
# thread with the bindings it offered. Its journal entry is the accepted fact, and what a started
# run adds when it starts.
#
# Existing sessions are locked first, in id order, then existing threads, in id order (the order a
# session's close takes them, and every batch's: no deadlock among them); the thread's lock waits
# for the sessions' by a sub-select in its condition, run before its first row is locked. Whether
# they are closed is read from the rows as the locks found them: a close that committed while this
# statement waited refuses the turn, and a close that waits for this statement counts it (a close
# counts after its lock: brain/store/sessions.py). With an owner, or a strategy for a busy thread
# other than enqueue (``brain.rules.doubletext``), the thread's unfinished turns are counted by a
# function that sees what committed meanwhile (migration 0013), so that of two served submits racing
# on an idle thread only one starts, and a reject never misses a turn that committed meanwhile.
_SUBMITS = f"""
WITH r AS NOT MATERIALIZED (SELECT * FROM {{rows}}),
session_lock AS (
    SELECT s.id, s.closed_at FROM r JOIN sessions s ON s.id = r.sid ORDER BY s.id FOR UPDATE OF s),
locked AS (
    SELECT th.id, th.closed_at, th.bindings IS NOT NULL AS bound FROM r JOIN threads th ON th.id = r.tid
     WHERE (SELECT count(*) FROM session_lock) >= 0 ORDER BY th.id FOR UPDATE OF th),
-- Each row as the checks found it: whether its turn is new and nothing conflicts (``fits``: a
-- reject also needs an idle thread), and
-- whether the announcements its offered bindings were chosen from are still those (``fresh``:
-- else a new thread does not freeze them).
known AS (
    SELECT *, turn_id IS NULL AND (agent_digest IS NULL OR agent_digest = adigest)
              AND (session_ns IS NULL OR (session_ns = ns AND session_closed IS NULL))
              AND (agent_name IS NULL OR (agent_name = aname AND agent_version = aversion
                                          AND thread_closed IS NULL))
              AND NOT (strategy = 'reject' AND thread_open > 0) AS fits,
              owner IS NOT NULL AND thread_open = 0 AND {owner_not_dead("owner")}
              AND (thread_bound OR (agent_name IS NULL AND offered IS NOT NULL AND fresh)) AS starts
      FROM (SELECT r.*, k.turn_id, k.input_digest, k.turn_thread, k.session_ns,
                   -- A new agent's version that an earlier row of this statement registers is
                   -- its: another content under it is a conflict, as it would be one by one.
                   coalesce(k.agent_digest, (SELECT e.adigest FROM r AS e
                                              WHERE e.aname = r.aname AND e.aversion = r.aversion
                                                AND e.ns = r.ns AND e.ord < r.ord
                                              ORDER BY e.ord LIMIT 1)) AS agent_digest,
                   CASE WHEN sl.id IS NULL THEN k.session_closed ELSE sl.closed_at END AS session_closed,
                   k.agent_name, k.agent_version,
                   CASE WHEN l.id IS NULL THEN k.thread_closed ELSE l.closed_at END AS thread_closed,
                   coalesce(l.bound, k.thread_bound) AS thread_bound,
                   CASE WHEN l.id IS NULL OR (r.owner IS NULL AND r.strategy = 'enqueue') THEN k.thread_open
                        ELSE thread_open_turns(r.tid, ARRAY[{TERMINAL_SQL[1:-1]}]) END AS thread_open,
                   r.tools IS NULL OR (b.n = r.marked AND b.at IS NOT DISTINCT FROM r.marked_at) AS fresh
              FROM r CROSS JOIN LATERAL ({_KNOWN}) AS k
              LEFT JOIN session_lock sl ON sl.id = r.sid LEFT JOIN locked l ON l.id = r.tid
              LEFT JOIN LATERAL (
                   SELECT count(*) AS n, max(announced_at) AS at FROM bindings
                    WHERE name IN (SELECT jsonb_array_elements_text(r.tools))) AS b ON r.tools IS NOT NULL
           ) AS x),
agent AS (
    INSERT INTO agents (namespace, name, version, digest, definition)
    SELECT ns, aname, aversion, adigest, adef FROM known WHERE fits AND agent_digest IS NULL
    ON CONFLICT DO NOTHING),  -- registered meanwhile by a submit of another transaction
session AS (
    INSERT INTO sessions (id, namespace, last_seq)
    SELECT sid, ns, 1 FROM known WHERE fits AND session_ns IS NULL),
thread AS (
    INSERT INTO threads (id, session_id, name, agent_name, agent_version, bindings)
    SELECT tid, sid, tname, aname, aversion, CASE WHEN starts THEN offered END
      FROM known WHERE fits AND agent_name IS NULL),
bump AS (
    UPDATE sessions s SET last_seq = s.last_seq + 1
      FROM known k WHERE s.id = k.sid AND k.fits AND k.session_ns IS NOT NULL RETURNING s.id, s.last_seq),
turn AS (
    INSERT INTO turns (id, namespace, session_id, thread_id, request_id, input_digest, status, phase,
                       lease_owner, lease_epoch, runs, lease_expires_at)
    SELECT new_turn, ns, sid, tid, rid, idigest, CASE WHEN starts THEN 'running' ELSE 'queued' END,
           CASE WHEN starts THEN 'model_request' ELSE 'prepare' END, CASE WHEN starts THEN owner END,
           starts::int, starts::int, CASE WHEN starts THEN ts_add(now(), lease) END
      FROM known WHERE fits RETURNING {TURN_COLUMNS}),
entry AS (
    INSERT INTO journal (session_id, seq, thread_id, turn_id, status, phase, facts)
    SELECT turn.session_id, coalesce(b.last_seq, 1), turn.thread_id, turn.id, turn.status, turn.phase,
           CASE WHEN turn.status = 'running' THEN k.said || k.started ELSE k.said END
      FROM turn JOIN known k ON k.new_turn = turn.id LEFT JOIN bump b ON b.id = turn.session_id
 RETURNING turn_id, seq),
hint AS (SELECT pg_notify($1, '') FROM (SELECT FROM known WHERE fits AND NOT starts LIMIT 1) AS queued)
SELECT k.ord, k.turn_id, k.input_digest, k.turn_thread, k.agent_digest, k.session_ns, k.session_closed,
       k.agent_name, k.agent_version, k.thread_closed, k.thread_bound, k.thread_open, k.fits AS created,
       (SELECT count(*) FROM hint) AS hinted, e.seq AS entry_seq, k.fresh AS bindings_fresh, turn.*
  FROM known k LEFT JOIN turn ON turn.id = k.new_turn LEFT JOIN entry e ON e.turn_id = k.new_turn"""
_SUBMIT_STATEMENTS = {
    one: _SUBMITS.replace("{rows}", rows_from("r", _ROW, 2, one=one)) for one in (False, True)
}

Asked = tuple[Submit, Start | None]


def waves(items: Sequence[Asked]) -> list[list[int]]:
    """The items' indexes in statements of distinct sessions (a session's second submit in a batch
    goes in the next statement, which sees the first's turn), in the order given."""
    out: list[list[int]] = []
    seen: dict[str, int] = {}
    for i, (s, _) in enumerate(items):
        n = seen[s.session_key] = seen.get(s.session_key, -1) + 1
        if n == len(out):
            out.append([])
        out[n].append(i)
    return out


class PgSubmits(Submits):
    def submits_in_one_statement(self, items: Sequence[Asked]) -> bool:
        return len(waves(items)) == 1

    async def submit_batch(self, conn: Connection, items: Sequence[Asked]) -> list[Submitted | TendonError]:
        done: list[Submitted | TendonError | None] = [None] * len(items)
        for wave in waves(items):
            recs = await self._submit_wave(conn, [items[i] for i in wave])
            for i, rec in zip(wave, recs, strict=True):
                done[i] = _submitted(rec, *items[i])
        return [d for d in done if d is not None]

    async def _submit_wave(self, conn: Connection, items: Sequence[Asked]) -> list[Any]:
        cols: list[list[Any]] = [[] for _ in _ROW]
        for ord_, (s, start) in enumerate(items):
            tools, mark = start.announced if start and start.announced else (None, (None, None))
            agent = s.agent
            values = [
                ord_, s.namespace, s.session_key, s.request_id, agent.name, agent.version, s.thread_id,
                agent.digest, as_json(agent.stored), f"turn-{new_id()}", s.input_digest,
                as_json(submit_facts(s, None)), s.thread, start.owner if start else None,
                as_json(start.bindings if start else None), start.lease_seconds if start else None,
                as_json(started_facts(start) if start else None),
                as_json(list(tools) if tools is not None else None), *mark, str(s.strategy),
            ]  # fmt: skip
            for col, value in zip(cols, values, strict=True):
                col.append(value)
        one = len(items) == 1
        wake_channel = items[0][0].wake_channel  # one Brain's, or one store's: the same for all
        recs = await conn.fetch(_SUBMIT_STATEMENTS[one], wake_channel, *row_args(cols, one=one))
        return sorted(recs, key=lambda r: r["ord"])

    async def submit_in(self, conn: Connection, s: Submit, start: Start | None) -> Submitted:
        (done,) = await self.submit_batch(conn, [(s, start)])
        return raised(done)


def _submitted(known: Any, s: Submit, start: Start | None) -> Submitted | TendonError:
    """What one row of the statement says a submit did (or why it was refused)."""
    if known["created"]:
        if known["status"] == "running":
            assert start is not None
            facts = submit_facts(s, start)
            row = TurnRow.from_record(known)
            return Submitted(row.id, True, row, known["entry_seq"], facts, frozen_by(known, start))
        return Submitted(known["id"], True, stale=known["agent_name"] is None and not known["bindings_fresh"])
    try:
        existing = check_submit(
            known, namespace=s.namespace, session_id=s.session_id, thread=s.thread, request_id=s.request_id,
            input_digest=s.input_digest, agent=s.agent,
        )  # fmt: skip
        if existing is None:
            check_busy(known, s.strategy, s.where)
    except TendonError as exc:
        return exc
    # Nothing conflicts, yet nothing was written: only a race that lost an insert does that,
    # which fails the statement (unique violation) and is tried again by ``transact``.
    assert existing is not None, f"submit of {s.request_id!r} neither found nor created a turn"
    return Submitted(existing, False)
