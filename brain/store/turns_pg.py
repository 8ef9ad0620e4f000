"""Turns on PostgreSQL: the same facts as the portable statements, written with many turns per
statement (arrays unnested) and one round trip per commit where data-modifying CTEs allow it."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from brain.rules.records import Claimed, Move, Moved, TurnRow
from brain.store.journal_pg import JOURNAL_ENTRIES
from brain.store.sql import TURN_COLUMNS, owner_not_dead, qualified
from brain.store.turns import CLAIM_SET, CLAIMABLE_FROM, Turns
from infra.db import Connection, as_json
from infra.db.rows import row_args, rows_from

# One walk of the claimable turns: one more is locked than is claimed, and finding it says there
# is more to claim (a second walk to count them read as much again as the claim itself).
_CLAIM = f"""
WITH candidate AS (SELECT t.id, t.wake_at, t.seq {CLAIMABLE_FROM} AND {owner_not_dead("$1")}
     ORDER BY t.wake_at, t.seq LIMIT $3 + 1 FOR UPDATE OF t SKIP LOCKED),
chosen AS (SELECT id FROM candidate ORDER BY wake_at, seq LIMIT $3),
claimed AS (
    UPDATE turns SET {CLAIM_SET} FROM chosen WHERE turns.id = chosen.id RETURNING turns.*)
SELECT {qualified("claimed", TURN_COLUMNS)}, now() AS now,
       (SELECT count(*) FROM candidate) AS claimable
  FROM claimed ORDER BY claimed.id"""

# The columns of a move: the guard (the turn as its run knew it) and what it becomes.
_MOVE = [
    ("id", "text"), ("owner", "text"), ("epoch", "int"), ("from_status", "text"), ("from_phase", "text"),
    ("from_revision", "int"), ("status", "text"), ("phase", "text"), ("waiting_for", "text"),
    ("model_calls", "int"), ("tool_step", "int"), ("retries", "int"), ("result", "jsonb"), ("error", "jsonb"),
    ("release", "bool"), ("wake_in", "float8"), ("facts", "jsonb"), ("bindings", "jsonb"),
    ("model_attempt", "int"),
]  # fmt: skip

# Many moves at once, each whole or not at all: the guarded turn updates, then only for the
# turns that moved their journal entries (seqs handed out by their sessions, in turn order),
# their executions and their threads' frozen bindings. It returns the turns' columns, not the
# facts and bindings the caller sent (decoding them again cost the Brain for nothing). $1 is the
# lease, the moves' columns follow (``infra.db.rows``: a lone move as a row of values).
_MOVES = f"""
WITH m AS (SELECT * FROM {{rows}}),
moved AS (
    UPDATE turns t
       SET status = m.status, phase = m.phase, waiting_for = m.waiting_for, model_calls = m.model_calls,
           tool_step = m.tool_step, retries = m.retries, result = m.result, error = m.error,
           model_attempt = m.model_attempt,
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
{{entries}},
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
                            error, how, wait_key, wait_until)
    SELECT i.id, i.turn_id, i.tool_step, i.call_id, i.route, i.tool, i.binding_digest, i.replay_policy,
           i.request_digest, i.status, i.message_id, i.command, $21, i.detail, i.error, i.how, i.wait_key,
           ts_add(now(), i.wait_seconds)
      FROM unnest($22::text[], $23::text[], $24::int[], $25::text[], $26::text[], $27::text[], $28::text[],
                  $29::text[], $30::text[], $31::text[], $32::bytea[], $33::bool[], $34::text[], $35::jsonb[],
                  $36::text[], $37::text[], $38::float8[])
           AS i(turn_id, id, tool_step, call_id, route, tool, binding_digest, replay_policy, request_digest,
                message_id, command, detail, status, error, how, wait_key, wait_seconds)
      JOIN moved ON moved.id = i.turn_id),"""
# A batch without intents does not name ``executions`` at all: a statement locks every table it
# names, even where it writes nothing, and these moves have no business with that table. By
# (whether it has intents, whether it is one move).
_MOVE_STATEMENTS = {
    (intents, one): _MOVES.replace("{rows}", rows_from("m", _MOVE, 2, one=one))
    .replace("{intent}", _INTENT if intents else "")
    .replace("{entries}", JOURNAL_ENTRIES[not one])
    for intents in (False, True)
    for one in (False, True)
}


class PgTurns(Turns):
    async def claim(self, conn: Connection, owner: str, lease_seconds: float, limit: int) -> Claimed:
        recs = await conn.fetch(_CLAIM, owner, lease_seconds, limit)
        if not recs:
            return Claimed([], False)
        return Claimed(
            [TurnRow.from_record(r) for r in recs], recs[0]["claimable"] > len(recs), recs[0]["now"]
        )

    async def commit_moves(
        self, conn: Connection, moves: Sequence[Move], lease_seconds: float
    ) -> list[Moved | None]:
        owners = {m.before.lease_owner for m in moves}
        assert len(owners) == 1, "one batch of moves comes from one Brain"
        ordered = sorted(moves, key=lambda m: m.before.id)
        cols: list[list[Any]] = [[] for _ in _MOVE]
        intents: list[list[Any]] = [[] for _ in range(17)]
        for m in ordered:
            b = m.before
            values = [
                b.id, b.lease_owner, b.lease_epoch, b.status, b.phase, b.revision, m.status, m.phase,
                m.waiting_for, m.value("model_calls"), m.value("tool_step"), m.value("retries"),
                as_json(m.value("result")), as_json(m.value("error")), m.release, m.wake_in,
                as_json(list(m.facts) or None), as_json(m.freeze), m.value("model_attempt"),
            ]  # fmt: skip
            for col, value in zip(cols, values, strict=True):
                col.append(value)
            for i in m.intents:
                row = [
                    b.id, i.execution_id, i.tool_step, i.call_id, i.route, i.tool, i.binding_digest,
                    i.replay_policy, i.request_digest, i.command_message_id, i.command, i.journal_detail,
                    i.status, as_json(i.error), i.how, i.wait_key, i.wait_seconds,
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
        self, conn: Connection, owner: str, turn_ids: Collection[str], lease_seconds: float
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
        rows = await self.store.read(
            lambda c: c.fetch("SELECT id, status FROM turns WHERE id = ANY($1::text[])", list(turn_ids))
        )
        return {r["id"]: r["status"] for r in rows}
