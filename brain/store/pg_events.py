"""The PostgreSQL backend of the execution and repair parts: one statement locks and reads every
execution a batch of events names, one more writes all their effects, journal entries, wake-ups
and claims; reads take arrays instead of loops (also those a claim makes for many turns: steps,
threads, journal entries)."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from brain.rules.records import (
    FINAL_SQL,
    TURN_COLUMNS,
    VIEW_EXECUTION_COLUMNS,
    Applied,
    ClaimBudget,
    Entry,
    TurnRow,
    TurnView,
    column_names,
    qualified,
)
from brain.store.executions import NAMED_COLUMNS, Planned, Touched, effect_values
from brain.store.journal import JOURNAL_COLUMNS
from brain.store.pg_turns import JOURNAL_ENTRIES
from brain.store.repairs import OPEN_SQL, RepairRows
from infra.db import Json
from infra.db.rows import row_args, rows_from

# By whether it locks one execution (``infra.db.rows``: one id is found by its key however
# small the tables are; an array of them is taken for ten).
_LOCK_NAMED = {
    one: f"""
SELECT {NAMED_COLUMNS}, t.namespace, t.session_id, t.thread_id, t.status AS turn_status,
       t.phase AS turn_phase, t.cancel_requested AS turn_cancelling
  FROM executions e JOIN turns t ON t.id = e.turn_id
 WHERE e.id = {"$1::text" if one else "ANY($1::text[])"} ORDER BY t.id, e.id FOR UPDATE OF t, e"""
    for one in (False, True)
}

_TURN_COLS = qualified("t", TURN_COLUMNS)

# Effects, wake-ups (a claim for this Brain where ``f.claim``), journal entries and the hint, in
# one statement. Its snapshot is taken after the turns were locked, so a sibling execution that
# ended in another transaction is seen; the ones this statement ends are in $14. The effects are
# $1-$9, the turns $10-$13, as rows of values when there is one of each (``infra.db.rows``).
_EFFECT = [
    ("id", "text"), ("status", "text"), ("last_seq", "int"), ("attempts", "int"), ("result", "jsonb"),
    ("how", "text"), ("evidence", "text"), ("output_bytes", "bigint"), ("error", "jsonb"),
]  # fmt: skip
_WAKE = [("turn_id", "text"), ("facts", "jsonb"), ("step", "int"), ("claim", "bool")]
_COMMIT_APPLY = f"""
WITH eff AS (
    UPDATE executions e
       SET status = m.status, last_seq = m.last_seq, attempts = m.attempts, result = m.result, how = m.how,
           evidence = m.evidence, output_bytes = m.output_bytes, error = m.error, replay_requested_at = NULL,
           stall_backoff = 1, nudges = 0, command = NULL, updated_at = now()
      FROM {{effects}}
     WHERE e.id = m.id),
f AS (SELECT * FROM {{wakes}}),
woken AS (
    UPDATE turns t
       SET status = 'running', wake_at = now(), waiting_for = NULL, updated_at = now(),
           revision = t.revision + 1,
           lease_owner = CASE WHEN f.claim AND t.pending = 0 THEN $15 END,
           lease_epoch = CASE WHEN f.claim AND t.pending = 0 THEN t.lease_epoch + 1 ELSE t.lease_epoch END,
           runs = CASE WHEN f.claim AND t.pending = 0 THEN t.runs + 1 ELSE t.runs END,
           lease_expires_at = CASE WHEN f.claim AND t.pending = 0 THEN ts_add(now(), $16) END,
           phase = CASE WHEN f.claim AND t.pending = 0 THEN 'model_request' ELSE t.phase END
      FROM f
     WHERE t.id = f.turn_id AND f.step IS NOT NULL AND t.status = 'waiting' AND t.phase = 'wait_tools'
       AND t.tool_step = f.step
       AND NOT EXISTS (SELECT 1 FROM executions e WHERE e.turn_id = t.id AND e.tool_step = t.tool_step
                         AND e.status NOT IN {FINAL_SQL} AND NOT e.id = ANY($14::text[])
                         AND NOT (t.cancel_requested AND e.status = 'unknown'))
 RETURNING {_TURN_COLS}, f.claim AND t.pending = 0 AS claim),
entry AS (
    SELECT f.turn_id, t.session_id, t.thread_id, coalesce(w.status, t.status) AS status,
           coalesce(w.phase, t.phase) AS phase, CASE WHEN w.claim THEN w.lease_epoch END AS run,
           CASE WHEN w.claim THEN coalesce(f.facts, '[]'::jsonb) || jsonb_build_array(
                    jsonb_build_object('kind', 'turn.run_started', 'run', w.runs, 'epoch', w.lease_epoch,
                                       'phase', 'wait_tools', 'owner', w.lease_owner),
                    jsonb_build_object('kind', 'turn.results_applied', 'executions',
                        (SELECT jsonb_agg(e.id ORDER BY e.call_id) FROM executions e
                          WHERE e.turn_id = w.id AND e.tool_step = w.tool_step)))
                ELSE f.facts END AS facts,
           row_number() OVER (PARTITION BY t.session_id ORDER BY f.turn_id) AS nth,
           count(*) OVER (PARTITION BY t.session_id) AS n
      FROM f JOIN turns t ON t.id = f.turn_id LEFT JOIN woken w ON w.id = f.turn_id
     WHERE f.facts IS NOT NULL OR w.claim),
{{entries}},
hint AS (SELECT pg_notify($17, '') WHERE EXISTS (SELECT 1 FROM woken WHERE NOT woken.claim))
SELECT woken.*, (SELECT count(*) FROM hint) AS hinted, w.seq AS entry_seq, e.facts AS entry_facts
  FROM woken LEFT JOIN written w ON w.turn_id = woken.id LEFT JOIN entry e ON e.turn_id = woken.id"""
_COMMIT_APPLIES = {
    one: _COMMIT_APPLY.replace("{effects}", rows_from("m", _EFFECT, 1, one=one))
    .replace("{wakes}", rows_from("f", _WAKE, 10, one=one))
    .replace("{entries}", JOURNAL_ENTRIES[not one])
    for one in (False, True)
}

_DUE_WAITING = f"""
WITH due AS (
    SELECT id FROM turns WHERE status = 'waiting' AND phase = 'wait_tools' AND wake_at <= now()
     ORDER BY wake_at LIMIT $1 FOR UPDATE SKIP LOCKED)
SELECT due.id AS turn_id, e.id, e.status, e.last_seq, e.route, e.request_digest, e.command_message_id,
       e.command, e.nudges, e.stall_backoff, e.created_at, e.updated_at, e.replay_requested_at,
       t.namespace, t.session_id, now() AS now,
       EXISTS (SELECT 1 FROM workers w WHERE w.id = e.created_by AND w.dead_at IS NULL) AS creator_alive,
       t.cancel_requested AS cancelling
  FROM due JOIN turns t ON t.id = due.id
  LEFT JOIN executions e ON e.turn_id = t.id AND e.tool_step = t.tool_step AND e.status IN {OPEN_SQL}
 ORDER BY due.id, e.call_id"""


_STEPS_EXECUTIONS = """
SELECT e.* FROM unnest($1::text[], $2::int[]) AS s(turn_id, tool_step)
  JOIN executions e ON e.turn_id = s.turn_id AND e.tool_step = s.tool_step
 ORDER BY e.turn_id, e.tool_step, e.call_id"""

_SESSIONS_ENTRIES = f"""
SELECT {qualified("j", JOURNAL_COLUMNS)}
  FROM unnest($1::text[], $2::bigint[]) AS a(session_id, seq)
  JOIN journal j ON j.session_id = a.session_id AND j.seq > a.seq
 ORDER BY j.session_id, j.seq"""


_JSONB = {"facts", "result", "error"}  # the jsonb columns of a turn's view


def _row_of(alias: str, columns: str) -> str:
    """``ROW(...)`` of ``columns``, its jsonb ones as text: asyncpg decodes the fields of an
    anonymous row in binary, which the pool's JSON codec (text) does not read."""
    fields = [f"{alias}.{c}::text" if c in _JSONB else f"{alias}.{c}" for c in column_names(columns)]
    return f"ROW({', '.join(fields)})"


_ENTRY_FIELDS = column_names(JOURNAL_COLUMNS)
_VIEW_FIELDS = column_names(VIEW_EXECUTION_COLUMNS)
# A turn's description in one statement (one round trip, one snapshot): its entries and
# executions as arrays of anonymous rows, which asyncpg gives as tuples.
_TURN_VIEW = f"""
SELECT {_TURN_COLS},
       ARRAY(SELECT {_row_of("j", JOURNAL_COLUMNS)} FROM journal j
              WHERE j.session_id = t.session_id AND j.turn_id = t.id ORDER BY j.seq) AS view_entries,
       ARRAY(SELECT {_row_of("e", VIEW_EXECUTION_COLUMNS)} FROM executions e
              WHERE e.turn_id = t.id ORDER BY e.tool_step, e.call_id) AS view_executions
  FROM turns t WHERE t.id = $1 AND t.namespace = $2"""


def _fields(names: list[str], row: tuple[Any, ...]) -> dict[str, Any]:
    return {k: json.loads(v) if k in _JSONB and v is not None else v for k, v in zip(names, row, strict=True)}


class PgExecutionRows(RepairRows):
    async def turn_view(self, conn: Any, namespace: str, turn_id: str) -> TurnView | None:
        rec = await conn.fetchrow(_TURN_VIEW, turn_id, namespace)
        if rec is None:
            return None
        return TurnView(
            TurnRow.from_record(rec),
            [Entry(**_fields(_ENTRY_FIELDS, row)) for row in rec["view_entries"]],
            [_fields(_VIEW_FIELDS, row) for row in rec["view_executions"]],
        )

    async def _lock_named(self, conn: Any, execution_ids: Sequence[str]) -> dict[str, Any]:
        one = len(execution_ids) == 1
        ids = execution_ids[0] if one else list(execution_ids)
        return {r["id"]: r for r in await conn.fetch(_LOCK_NAMED[one], ids)}

    async def _commit_apply(
        self,
        conn: Any,
        planned: Sequence[Planned],
        touched: Touched,
        wake_channel: str,
        budget: ClaimBudget | None,
    ) -> Applied:
        effects: list[list[Any]] = [[] for _ in _EFFECT]
        for plan in planned:
            for col, value in zip(
                effects, [plan.row["id"], *effect_values(plan.row, plan.effect)], strict=True
            ):
                col.append(value)
        turns: list[list[Any]] = [[] for _ in _WAKE]
        finished: list[str] = []
        candidates = 0
        for turn_id in sorted(touched):
            turn = touched[turn_id]
            claim = turn.step_done is not None and budget is not None and budget.take()
            candidates += claim
            facts = Json(turn.facts) if turn.facts else None  # a list would read as an array dimension
            for col, value in zip(turns, [turn_id, facts, turn.step_done, claim], strict=True):
                col.append(value)
            finished += turn.finished
        owner = budget.owner if budget is not None else None
        lease = budget.lease_seconds if budget is not None else 0.0
        one = len(effects[0]) == 1 and len(turns[0]) == 1
        recs = await conn.fetch(
            _COMMIT_APPLIES[one], *row_args(effects, one=one), *row_args(turns, one=one), finished, owner,
            float(lease), wake_channel,
        )  # fmt: skip
        claimed = [TurnRow.from_record(r) for r in recs if r["claim"]]
        if budget is not None:
            budget.left += candidates - len(claimed)  # not woken after all: their slots stay free
        entries = {r["id"]: (r["entry_seq"], r["entry_facts"]) for r in recs if r["claim"]}
        return Applied(refused=[], woken=len(recs), claimed=claimed, entries=entries)

    async def executions_by_id(self, conn: Any, ids: Sequence[str]) -> dict[str, Any]:
        rows = await conn.fetch("SELECT * FROM executions WHERE id = ANY($1::text[])", list(ids))
        return {r["id"]: r for r in rows}

    async def steps_executions(
        self, conn: Any, steps: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], list[Any]]:
        found: dict[tuple[str, int], list[Any]] = {step: [] for step in steps}
        for r in await conn.fetch(_STEPS_EXECUTIONS, [t for t, _ in found], [s for _, s in found]):
            found[(r["turn_id"], r["tool_step"])].append(r)
        return found

    async def sessions_entries(self, conn: Any, after: Mapping[str, int]) -> dict[str, list[Entry]]:
        found: dict[str, list[Entry]] = {session: [] for session in after}
        for r in await conn.fetch(_SESSIONS_ENTRIES, list(after), list(after.values())):
            found[r["session_id"]].append(Entry.from_record(r))
        return found

    async def look_later(self, conn: Any, looks: Mapping[str, float]) -> None:
        await conn.execute(
            """UPDATE turns t SET wake_at = ts_add(now(), l.seconds)
                 FROM unnest($1::text[], $2::float8[]) AS l(id, seconds)
                WHERE t.id = l.id AND t.status = 'waiting'""",
            list(looks),
            list(looks.values()),
        )

    async def binding_rows(self, conn: Any, tools: Sequence[str]) -> list[Any]:
        return list(
            await conn.fetch(
                "SELECT name, binding, announced_at FROM bindings WHERE name = ANY($1::text[])", list(tools)
            )
        )

    async def threads(self, conn: Any, thread_ids: Sequence[str]) -> list[Any]:
        return await conn.fetch("SELECT * FROM threads WHERE id = ANY($1::text[])", list(thread_ids))

    async def bound_routes(self, tools: Sequence[str]) -> list[tuple[str, str]]:
        rows = await self.read(
            lambda c: c.fetch(
                "SELECT DISTINCT name, route FROM bindings WHERE name = ANY($1::text[]) ORDER BY name, route",
                list(tools),
            )
        )
        return [(r["name"], r["route"]) for r in rows]

    async def due_waiting(self, conn: Any, limit: int = 100) -> list[Any]:
        rows = await conn.fetch(_DUE_WAITING, limit)
        return [r if r["id"] is not None else {"turn_id": r["turn_id"], "id": None} for r in rows]

    async def controls_published(self, conn: Any, ids: Collection[int]) -> None:
        await conn.execute("UPDATE outbox SET published_at = now() WHERE id = ANY($1::bigint[])", list(ids))
