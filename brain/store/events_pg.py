"""Applying events on PostgreSQL: one statement locks and reads every execution a batch of events
names, one more writes all their effects, journal entries, wake-ups and claims."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from brain.rules.records import Applied, ClaimBudget, TurnRow
from brain.rules.states import TurnStatus
from brain.store.events import NAMED_COLUMNS, WOKEN, Events, Planned, Touched, effect_values
from brain.store.journal_pg import JOURNAL_ENTRIES
from brain.store.sql import FINAL_SQL, TURN_COLUMNS, owner_not_dead, qualified, turn_becomes
from infra.db import Connection, Json
from infra.db.rows import row_args, rows_from

WOKEN_T = turn_becomes(TurnStatus.RUNNING, from_={TurnStatus.WAITING}, alias="t")

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
f AS (SELECT x.turn_id, x.facts, x.step, x.claim AND {owner_not_dead("CAST($15 AS text)")} AS claim
        FROM {{wakes}}),
woken AS (
    UPDATE turns t
       SET {WOKEN.set}, wake_at = now(), waiting_for = NULL, updated_at = now(),
           revision = t.revision + 1,
           lease_owner = CASE WHEN f.claim AND t.pending = 0 THEN $15 END,
           lease_epoch = CASE WHEN f.claim AND t.pending = 0 THEN t.lease_epoch + 1 ELSE t.lease_epoch END,
           runs = CASE WHEN f.claim AND t.pending = 0 THEN t.runs + 1 ELSE t.runs END,
           lease_expires_at = CASE WHEN f.claim AND t.pending = 0 THEN ts_add(now(), $16) END,
           phase = CASE WHEN f.claim AND t.pending = 0 THEN 'model_request' ELSE t.phase END
      FROM f
     WHERE t.id = f.turn_id AND f.step IS NOT NULL AND {WOKEN_T.guard} AND t.phase = 'wait_tools'
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
    .replace("{wakes}", rows_from("x", _WAKE, 10, one=one))
    .replace("{entries}", JOURNAL_ENTRIES[not one])
    for one in (False, True)
}


class PgEvents(Events):
    async def _lock_named(self, conn: Connection, execution_ids: Sequence[str]) -> dict[str, Any]:
        one = len(execution_ids) == 1
        ids = execution_ids[0] if one else list(execution_ids)
        return {r["id"]: r for r in await conn.fetch(_LOCK_NAMED[one], ids)}

    async def _commit_apply(
        self,
        conn: Connection,
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
