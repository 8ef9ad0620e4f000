"""The PostgreSQL backend of the turn and journal parts: the same facts as the portable ones,
written with many turns per statement (arrays unnested) and one round trip per commit where
data-modifying CTEs allow it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, TypeVar

from brain.store.records import TERMINAL_SQL, TURN_COLUMNS, Claimed, Move, Moved, TurnRow, qualified
from brain.store.submits import (
    KNOWN_SQL,
    Start,
    Submit,
    Submitted,
    check_submit,
    frozen_by,
    started_facts,
    submit_facts,
)
from brain.store.turns import CLAIM_SET, CLAIMABLE_FROM, TurnRows
from infra.db import Json, reading
from infra.held import HeldConnection
from infra.param_rows import row_args, rows_from
from protocol import new_id

T = TypeVar("T")

# The submit in one statement: the checks' read, and (when nothing conflicts and the turn is new)
# the agent, a new session, a new thread, the turn, its journal entry and the wake-up hint. With
# an owner ($14) it starts the turn's run when ``starts_now`` says so (the same rule, in SQL):
# the turn goes in claimed and prepared, a new thread with the bindings it freezes ($15). Its
# journal entry is the accepted fact ($11), and what a started run adds ($17) when it starts.
#
# An existing session and thread are locked first, the session before the thread (the order a
# session's close takes them: no deadlock between the two), and whether they are closed is read
# from the rows as the locks found them: a close that committed while this statement waited for
# its lock refuses this turn, and a close that waits for this statement counts it (a close counts
# after its lock: brain/store/sessions.py). With an owner, the thread's unfinished turns are
# counted by a function that sees what committed meanwhile (migration 0013), so that of two
# served submits racing on an idle thread only one starts.
_SUBMIT = f"""
WITH session_lock AS (SELECT id, closed_at FROM sessions WHERE id = $2 FOR UPDATE),
-- The thread's row lock is taken above its join with the session's lock, so always after it
-- (a column of that join is named only to keep the join in the plan).
locked AS (SELECT th.id, th.closed_at, th.bindings IS NOT NULL AS bound, sl.closed_at AS session_closed
             FROM threads th LEFT JOIN session_lock sl ON true WHERE th.id = $6 FOR UPDATE OF th),
known AS (
    SELECT k.turn_id, k.input_digest, k.turn_thread, k.agent_digest, k.session_ns,
           CASE WHEN sl.id IS NULL THEN k.session_closed ELSE sl.closed_at END AS session_closed,
           k.agent_name, k.agent_version,
           CASE WHEN l.id IS NULL THEN k.thread_closed ELSE l.closed_at END AS thread_closed,
           coalesce(l.bound, k.thread_bound) AS thread_bound,
           CASE WHEN l.id IS NULL OR $14::text IS NULL THEN k.thread_open
                ELSE thread_open_turns($6, ARRAY[{TERMINAL_SQL[1:-1]}]) END AS thread_open
      FROM ({KNOWN_SQL}) AS k LEFT JOIN session_lock sl ON true LEFT JOIN locked l ON true),
-- Whether the announcements the offered bindings were chosen from ($18 the tools, $19 how many
-- rows, $20 the latest time) are still those: else a new thread does not freeze them.
mark AS (
    SELECT $18::text[] IS NULL
           OR (count(*) = $19::bigint AND max(announced_at) IS NOT DISTINCT FROM $20::timestamptz) AS fresh
      FROM bindings WHERE name = ANY($18::text[])),
ok AS (
    SELECT *, $14::text IS NOT NULL AND thread_open = 0
              AND (thread_bound OR (agent_name IS NULL AND $15::jsonb IS NOT NULL
                                    AND (SELECT fresh FROM mark))) AS starts
      FROM known
     WHERE turn_id IS NULL AND (agent_digest IS NULL OR agent_digest = $7)
       AND (session_ns IS NULL OR (session_ns = $1 AND session_closed IS NULL))
       AND (agent_name IS NULL OR (agent_name = $4 AND agent_version = $5 AND thread_closed IS NULL))),
agent AS (
    INSERT INTO agents (name, version, digest, definition)
    SELECT $4, $5, $7, $8 FROM ok WHERE ok.agent_digest IS NULL ON CONFLICT DO NOTHING),
session AS (
    INSERT INTO sessions (id, namespace, last_seq) SELECT $2, $1, 1 FROM ok WHERE ok.session_ns IS NULL),
thread AS (
    INSERT INTO threads (id, session_id, name, agent_name, agent_version, bindings)
    SELECT $6, $2, $13, $4, $5, CASE WHEN ok.starts THEN $15::jsonb END FROM ok WHERE ok.agent_name IS NULL),
bump AS (
    UPDATE sessions SET last_seq = last_seq + 1
     WHERE id = $2 AND EXISTS (SELECT 1 FROM ok WHERE ok.session_ns IS NOT NULL) RETURNING last_seq),
turn AS (
    INSERT INTO turns (id, namespace, session_id, thread_id, request_id, input_digest, status, phase,
                       lease_owner, lease_epoch, runs, lease_expires_at)
    SELECT $9, $1, $2, $6, $3, $10, CASE WHEN starts THEN 'running' ELSE 'queued' END,
           CASE WHEN starts THEN 'model_request' ELSE 'prepare' END, CASE WHEN starts THEN $14 END,
           starts::int, starts::int, CASE WHEN starts THEN ts_add(now(), $16) END
      FROM ok RETURNING {TURN_COLUMNS}),
entry AS (
    INSERT INTO journal (session_id, seq, thread_id, turn_id, status, phase, facts)
    SELECT $2, coalesce((SELECT last_seq FROM bump), 1), $6, $9, turn.status, turn.phase,
           CASE WHEN turn.status = 'running' THEN $11::jsonb || $17::jsonb ELSE $11::jsonb END
      FROM turn RETURNING seq),
hint AS (SELECT pg_notify($12, '') FROM ok WHERE NOT ok.starts)
SELECT known.*, (SELECT count(*) FROM ok) > 0 AS created, (SELECT count(*) FROM hint) AS hinted,
       (SELECT seq FROM entry) AS entry_seq, (SELECT fresh FROM mark) AS bindings_fresh, turn.*
  FROM known LEFT JOIN turn ON true"""

# One walk of the claimable turns: one more is locked than is claimed, and finding it says there
# is more to claim (a second walk to count them read as much again as the claim itself).
_CLAIM = f"""
WITH candidate AS (SELECT t.id, t.wake_at, t.seq {CLAIMABLE_FROM}
     ORDER BY t.wake_at, t.seq LIMIT $3 + 1 FOR UPDATE OF t SKIP LOCKED),
chosen AS (SELECT id FROM candidate ORDER BY wake_at, seq LIMIT $3),
claimed AS (
    UPDATE turns SET {CLAIM_SET} FROM chosen WHERE turns.id = chosen.id RETURNING turns.*)
SELECT {qualified("claimed", TURN_COLUMNS)}, now() AS now,
       (SELECT count(*) FROM candidate) AS claimable
  FROM claimed ORDER BY claimed.id"""

# The journal entries of a statement's ``entry`` CTE (turn_id, session_id, thread_id, run, status,
# phase, facts, and its nth of n in its session): each session's seq bumped once by n, the
# entries numbered in order after its last one. Returns (turn_id, seq) as ``written``.
JOURNAL_ENTRIES = """bump AS (
    UPDATE sessions s SET last_seq = s.last_seq + e.n
      FROM (SELECT DISTINCT session_id, n FROM entry) AS e WHERE s.id = e.session_id
 RETURNING s.id, s.last_seq),
written AS (
    INSERT INTO journal (session_id, seq, thread_id, turn_id, run, status, phase, facts)
    SELECT e.session_id, b.last_seq - e.n + e.nth, e.thread_id, e.turn_id, e.run, e.status, e.phase, e.facts
      FROM entry e JOIN bump b ON b.id = e.session_id
 RETURNING turn_id, seq)"""

# The columns of a move: the guard (the turn as its run knew it) and what it becomes.
_MOVE = [
    ("id", "text"), ("owner", "text"), ("epoch", "int"), ("from_status", "text"), ("from_phase", "text"),
    ("from_revision", "int"), ("status", "text"), ("phase", "text"), ("waiting_for", "text"),
    ("model_calls", "int"), ("tool_step", "int"), ("retries", "int"), ("result", "jsonb"), ("error", "jsonb"),
    ("release", "bool"), ("wake_in", "float8"), ("facts", "jsonb"), ("bindings", "jsonb"),
]  # fmt: skip

# Many moves at once, each whole or not at all: the guarded turn updates, then only for the
# turns that moved their journal entries (seqs handed out by their sessions, in turn order),
# their executions and their threads' frozen bindings. It returns the turns' columns, not the
# facts and bindings the caller sent (decoding them again cost the Brain for nothing). $1 is the
# lease, the moves' columns follow (``infra.param_rows``: a lone move as a row of values).
_MOVES = f"""
WITH m AS (SELECT * FROM {{rows}}),
moved AS (
    UPDATE turns t
       SET status = m.status, phase = m.phase, waiting_for = m.waiting_for, model_calls = m.model_calls,
           tool_step = m.tool_step, retries = m.retries, result = m.result, error = m.error,
           lease_owner = CASE WHEN m.release THEN NULL ELSE t.lease_owner END,
           lease_expires_at = CASE WHEN m.release THEN NULL ELSE ts_add(now(), $1) END,
           wake_at = CASE WHEN m.wake_in IS NULL THEN t.wake_at ELSE ts_add(now(), m.wake_in) END,
           revision = t.revision + 1, updated_at = now()
      FROM m
     WHERE t.id = m.id AND t.lease_owner = m.owner AND t.lease_epoch = m.epoch AND t.status = m.from_status
       AND t.phase = m.from_phase AND t.revision = m.from_revision
 RETURNING {qualified("t", TURN_COLUMNS)}, m.facts,
           m.bindings AS freeze_to, m.epoch AS run),
entry AS (
    SELECT id AS turn_id, session_id, thread_id, run, status, phase, facts,
           row_number() OVER (PARTITION BY session_id ORDER BY id) AS nth,
           count(*) OVER (PARTITION BY session_id) AS n
      FROM moved WHERE facts IS NOT NULL),
{JOURNAL_ENTRIES},
{{intent}}
frozen AS (
    UPDATE threads th SET bindings = moved.freeze_to
      FROM moved WHERE moved.freeze_to IS NOT NULL AND th.id = moved.thread_id AND th.bindings IS NULL
 RETURNING th.id)
SELECT {qualified("moved", TURN_COLUMNS)}, w.seq,
       moved.thread_id IN (SELECT id FROM frozen) AS froze
  FROM moved LEFT JOIN written w ON w.turn_id = moved.id"""
_INTENT = """intent AS (
    INSERT INTO executions (id, turn_id, tool_step, call_id, route, tool, binding_digest, replay_policy,
                            request_digest, status, command_message_id, command, created_by, journal_detail,
                            error, how)
    SELECT i.id, i.turn_id, i.tool_step, i.call_id, i.route, i.tool, i.binding_digest, i.replay_policy,
           i.request_digest, i.status, i.message_id, i.command, $20, i.detail, i.error, i.how
      FROM unnest($21::text[], $22::text[], $23::int[], $24::text[], $25::text[], $26::text[], $27::text[],
                  $28::text[], $29::text[], $30::text[], $31::bytea[], $32::bool[], $33::text[], $34::jsonb[],
                  $35::text[])
           AS i(turn_id, id, tool_step, call_id, route, tool, binding_digest, replay_policy, request_digest,
                message_id, command, detail, status, error, how)
      JOIN moved ON moved.id = i.turn_id),"""
# A batch without intents does not name ``executions`` at all: a statement locks every table it
# names, even where it writes nothing, and these moves have no business with that table. By
# (whether it has intents, whether it is one move).
_MOVE_STATEMENTS = {
    (intents, one): _MOVES.replace("{rows}", rows_from("m", _MOVE, 2, one=one)).replace(
        "{intent}", _INTENT if intents else ""
    )
    for intents in (False, True)
    for one in (False, True)
}

_APPEND = """
WITH bump AS (UPDATE sessions SET last_seq = last_seq + 1 WHERE id = $1 RETURNING last_seq)
INSERT INTO journal (session_id, seq, thread_id, turn_id, run, status, phase, facts)
SELECT $1, last_seq, $2, $3, $4, $5, $6, $7 FROM bump RETURNING seq"""


def _json(value: Any) -> Any:
    # An element of a jsonb[] parameter: a list would read as one more array dimension.
    return None if value is None else Json(value)


class PgTurnRows(TurnRows):
    FOR_UPDATE = " FOR UPDATE"
    SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"
    ONE_STATEMENT_COMMITS = True
    HOLDS_CONNECTIONS = True

    async def append(
        self,
        conn: Any,
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

    async def submit_in(self, conn: Any, s: Submit, start: Start | None) -> Submitted:
        turn_id = f"turn-{new_id()}"
        agent = s.agent
        tools, mark = start.announced if start and start.announced else (None, (None, None))
        known = await conn.fetchrow(
            _SUBMIT, s.namespace, s.session_id, s.request_id, agent.name, agent.version, s.thread_id,
            agent.digest, agent.stored, turn_id, s.input_digest, submit_facts(s, None),
            s.wake_channel, s.thread, start.owner if start else None,
            start.bindings if start else None, start.lease_seconds if start else None,
            started_facts(start) if start else None, list(tools) if tools is not None else None, *mark,
        )  # fmt: skip
        if known["created"]:
            if known["status"] == "running":
                assert start is not None
                row = TurnRow.from_record(known)
                facts = submit_facts(s, start)
                return Submitted(turn_id, True, row, known["entry_seq"], facts, frozen_by(known, start))
            return Submitted(turn_id, True, stale=known["agent_name"] is None and not known["bindings_fresh"])
        existing = check_submit(
            known, namespace=s.namespace, session_id=s.session_id, thread=s.thread, request_id=s.request_id,
            input_digest=s.input_digest, agent=agent,
        )  # fmt: skip
        # Nothing conflicts, yet nothing was written: only a race that lost an insert does that,
        # which fails the statement (unique violation) and is tried again by ``transact``.
        assert existing is not None, f"submit of {s.request_id!r} neither found nor created a turn"
        return Submitted(existing, False)

    async def submit_served(self, s: Submit, start: Start, held: HeldConnection | None = None) -> Submitted:
        return await self.transact(
            lambda conn: self.submit_in(conn, s, start),
            single_statement=True, read_then_insert=True, held=held,
        )  # fmt: skip

    async def read_consistent(self, work: Callable[[Any], Awaitable[T]]) -> T:
        async with reading(self.pool) as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            return await work(conn)

    async def claim(self, conn: Any, owner: str, lease_seconds: float, limit: int) -> Claimed:
        recs = await conn.fetch(_CLAIM, owner, lease_seconds, limit)
        if not recs:
            return Claimed([], False)
        return Claimed(
            [TurnRow.from_record(r) for r in recs], recs[0]["claimable"] > len(recs), recs[0]["now"]
        )

    async def commit_moves(
        self, conn: Any, moves: Sequence[Move], lease_seconds: float
    ) -> list[Moved | None]:
        owners = {m.before.lease_owner for m in moves}
        assert len(owners) == 1, "one batch of moves comes from one Brain"
        ordered = sorted(moves, key=lambda m: m.before.id)
        cols: list[list[Any]] = [[] for _ in _MOVE]
        intents: list[list[Any]] = [[] for _ in range(15)]
        for m in ordered:
            b = m.before
            values = [
                b.id, b.lease_owner, b.lease_epoch, b.status, b.phase, b.revision, m.status, m.phase,
                m.waiting_for, m.value("model_calls"), m.value("tool_step"), m.value("retries"),
                _json(m.value("result")), _json(m.value("error")), m.release, m.wake_in,
                _json(list(m.facts) or None), _json(m.freeze),
            ]  # fmt: skip
            for col, value in zip(cols, values, strict=True):
                col.append(value)
            for i in m.intents:
                row = [
                    b.id, i.execution_id, i.tool_step, i.call_id, i.route, i.tool, i.binding_digest,
                    i.replay_policy, i.request_digest, i.command_message_id, i.command, i.journal_detail,
                    i.status, _json(i.error), i.how,
                ]  # fmt: skip
                for col, value in zip(intents, row, strict=True):
                    col.append(value)
        one = len(ordered) == 1
        args = [float(lease_seconds), *row_args(cols, one=one)]
        if intents[0]:
            recs = await conn.fetch(_MOVE_STATEMENTS[True, one], *args, owners.pop(), *intents)
        else:
            recs = await conn.fetch(_MOVE_STATEMENTS[False, one], *args)
        done = {r["id"]: Moved(TurnRow.from_record(r), r["seq"], bool(r["froze"])) for r in recs}
        return [done.get(m.before.id) for m in moves]

    async def renew_leases(
        self, conn: Any, owner: str, turn_ids: Collection[str], lease_seconds: float
    ) -> None:
        if turn_ids:
            await conn.execute(
                "UPDATE turns SET lease_expires_at = ts_add(now(), $3)"
                " WHERE id = ANY($2::text[]) AND lease_owner = $1",
                owner,
                list(turn_ids),
                lease_seconds,
            )

    async def statuses(self, turn_ids: Sequence[str]) -> dict[str, str]:
        rows = await self.read(
            lambda c: c.fetch("SELECT id, status FROM turns WHERE id = ANY($1::text[])", list(turn_ids))
        )
        return {r["id"]: r["status"] for r in rows}
