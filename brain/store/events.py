"""Applying the sequenced events Hands send to the Brain's executions.

``apply_events`` takes several executions' event ranges in one transaction. Here every range
goes the careful way (lock, classify, plan, write); ``events_pg`` locks and reads them in one
statement and writes all their effects in one more. Either way, each turn the
apply touched gets one journal entry, and a turn whose step is done is woken, or claimed at once
for a run of this Brain when it has a free slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from brain.rules import facts
from brain.rules.applying import Effect, Execution, effect, late_note
from brain.rules.records import Applied, ClaimBudget, Ended, TurnRow
from brain.rules.sequencing import drainable
from brain.rules.states import TERMINAL_EXECUTION, ExecutionStatus, TurnStatus
from brain.rules.submits import session_key
from brain.store.part import Part
from brain.store.sql import FINAL_SQL, TURN_COLUMNS, owner_not_dead, turn_becomes
from infra.db import Connection, Json, Row, as_json
from infra.db.store import as_time
from infra.process.logging import get_logger
from protocol import ConflictError, NotFoundError, RoutingError, TendonError, decode, encode


@dataclass
class TurnTouched:
    """What one apply did to one turn: the facts of its entry, and whether a step may be done."""

    session_id: str
    thread_id: str
    status: str
    phase: str
    facts: list[dict[str, Any]] = field(default_factory=list)
    step_done: int | None = None  # the tool step an execution of which just ended
    finished: list[str] = field(default_factory=list)  # executions that ended in this apply
    run: int | None = None  # the epoch of the run this apply claimed the turn for


class Touched(dict[str, TurnTouched]):
    """The turns of one apply, by id."""

    def turn(self, row: Any) -> TurnTouched:
        if row["turn_id"] not in self:
            self[row["turn_id"]] = TurnTouched(
                row["session_id"], row["thread_id"], row["turn_status"], row["turn_phase"]
            )
        return self[row["turn_id"]]


log = get_logger(__name__)

# The execution an event names, with its turn's scope and state.
NAMED_COLUMNS = """e.id, e.turn_id, e.tool_step, e.call_id, e.tool, e.status, e.last_seq, e.attempts,
                   e.result,
                   e.how, e.evidence, e.output_bytes, e.error, e.request_digest, e.holding, e.nudges,
                   e.journal_detail, e.created_at, e.worker"""
_NAMED = f"""SELECT {NAMED_COLUMNS}, t.namespace, t.session_id, t.thread_id, t.status AS turn_status,
                     t.phase AS turn_phase, t.cancel_requested AS turn_cancelling
              FROM executions e JOIN turns t ON t.id = e.turn_id WHERE e.id = $1"""
_PROGRESS = "replay_requested_at = NULL, stall_backoff = 1, nudges = 0, command = NULL, updated_at = now()"
# A waiting turn whose step is done (for a cancelling one, UNKNOWN counts as settled), woken;
# with an owner ($3), claimed for that owner's run at once (past APPLY_RESULTS: its results go to
# the model next), unless controls wait for it (then a claim applies them first).
SETTLED = f"""NOT EXISTS (SELECT 1 FROM executions e WHERE e.turn_id = t.id AND e.tool_step = t.tool_step
                            AND e.status NOT IN {FINAL_SQL}
                            AND NOT (t.cancel_requested AND e.status = 'unknown'))"""
_CLAIM_NOW = f"(CAST($3 AS text) IS NOT NULL AND pending = 0 AND {owner_not_dead('CAST($3 AS text)')})"
# A waiting turn whose tools all answered goes on (its run, or a claim, applies their results).
WOKEN = turn_becomes(TurnStatus.RUNNING, from_={TurnStatus.WAITING})
_WAKE = f"""
    UPDATE turns AS t SET {WOKEN.set}, wake_at = now(), waiting_for = NULL, updated_at = now(),
           revision = revision + 1, lease_owner = CASE WHEN {_CLAIM_NOW} THEN CAST($3 AS text) END,
           lease_epoch = CASE WHEN {_CLAIM_NOW} THEN lease_epoch + 1 ELSE lease_epoch END,
           runs = CASE WHEN {_CLAIM_NOW} THEN runs + 1 ELSE runs END,
           lease_expires_at = CASE WHEN {_CLAIM_NOW} THEN ts_add(now(), $4) END,
           phase = CASE WHEN {_CLAIM_NOW} THEN 'model_request' ELSE phase END
     WHERE id = $1 AND {WOKEN.guard} AND phase = 'wait_tools' AND tool_step = $2
       AND EXISTS (SELECT 1 FROM executions e WHERE e.turn_id = $1 AND e.tool_step = $2)
       AND {SETTLED}
 RETURNING {TURN_COLUMNS}"""


def effect_values(row: Any, done: Effect) -> list[Any]:
    """An execution's columns after ``done``, in ``events_pg._EFFECT``'s order (status... worker)."""
    outcome = done.outcome or {}
    keep = done.outcome is None
    error = done.error if done.error is not None else (row["error"] if keep else outcome["error"])
    # A result is JSON even when it is a bare string or null; a failure has none (NULL).
    succeeded = done.status is ExecutionStatus.SUCCEEDED
    result = as_json(row["result"]) if keep else Json(outcome["result"]) if succeeded else None
    return [
        str(done.status),
        done.last_seq,
        row["attempts"] if done.attempts is None else done.attempts,
        result,
        ("awaiting_input" if done.asked else row["how"]) if keep else outcome["how"],
        row["evidence"] if keep else outcome["evidence"],
        max(row["output_bytes"] or 0, done.output_end) if keep else outcome["output_bytes"],
        as_json(error),
        row["worker"] if done.worker is None else done.worker,
    ]


def outcome_read(row: Any, done: Effect) -> dict[str, Any]:
    """An execution after ``done`` as a read of its row gives what the history tells the model."""
    status, _, _, result, how, _, _, error, _ = effect_values(row, done)
    read = {"id": row["id"], "call_id": row["call_id"], "tool": row["tool"], "status": status, "how": how}
    values = {"result": result, "error": error}
    return read | {k: v.value if isinstance(v, Json) else v for k, v in values.items()}


@dataclass
class Planned:
    """The main write of one execution's applied events: its row as read, and their effect."""

    row: Any
    effect: Effect


class Events(Part):
    # ---- applying events ---------------------------------------------------------------

    async def apply_events(
        self,
        conn: Connection,
        ranges: Sequence[Sequence[Any]],
        *,
        wake_channel: str,
        budget: ClaimBudget | None,
    ) -> Applied:
        """Apply each range (one execution's events, in seq order) inside the caller's
        transaction. A range refused (unknown execution, foreign scope or digest, a move the
        table forbids) writes nothing and the others go on; ranges of one execution are merged."""
        merged: dict[str, dict[int, Any]] = {}
        for events in ranges:
            for event in events:
                merged.setdefault(event.execution_id, {}).setdefault(event.seq, event)
        named = await self._lock_named(conn, sorted(merged))
        touched = Touched()
        planned: list[Planned] = []
        refusals: dict[str, Exception] = {}
        for execution_id in sorted(merged):
            events = [merged[execution_id][seq] for seq in sorted(merged[execution_id])]
            try:
                plan = await self._plan(conn, named.get(execution_id), events, touched)
            except TendonError as exc:
                if exc.retryable:
                    raise
                refusals[execution_id] = exc
                continue
            if plan is not None:
                planned.append(plan)
        applied = await self._commit_apply(conn, planned, touched, wake_channel, budget)
        if applied.claimed:
            ended = [p for p in planned if p.effect.terminal]
            applied.outcomes = {p.row["id"]: outcome_read(p.row, p.effect) for p in ended}
        applied.ended = {
            p.row["id"]: Ended(p.row["tool"], str(p.effect.status), as_time(p.row["created_at"]))
            for p in planned
            if p.effect.terminal
        }
        applied.refused = [
            next((refusals[e.execution_id] for e in events if e.execution_id in refusals), None)
            for events in ranges
        ]
        # Each claimed turn goes to the first range with an execution of it: that range's
        # caller hands it to a run once the commit is done.
        turn_of = {execution_id: row["turn_id"] for execution_id, row in named.items()}
        claimed = {row.id: row for row in applied.claimed}
        applied.claimed_by = []
        for events in ranges:
            mine = [
                claimed.pop(t)
                for t in dict.fromkeys(turn_of.get(e.execution_id) for e in events)
                if t in claimed
            ]
            applied.claimed_by.append(mine)
        return applied

    async def _lock_named(self, conn: Connection, execution_ids: Sequence[str]) -> dict[str, Any]:
        """The executions events name, with their turns' scope and state, locked for this
        transaction: each turn before its executions, turns in id order (the order every writer
        of turns and then executions takes its locks in)."""
        found = {}
        for execution_id in execution_ids:
            row = await conn.fetchrow(_NAMED + self.store.FOR_UPDATE, execution_id)
            if row is not None:
                found[execution_id] = row
        return found

    async def _plan(
        self, conn: Connection, row: Any, events: Sequence[Any], touched: Touched
    ) -> Planned | None:
        """Classify one execution's events and plan their main write (None: nothing to apply).
        The rare writes (held events, a late outcome, output pages, a turn's reconcile note)
        are made here; the main one is left to :meth:`_commit_apply`. Raises before writing
        anything when the events are refused."""
        row = _named(row, events[0])
        last = row["last_seq"]
        fresh = [e for e in events if e.seq > last]
        if row["nudges"] and any(e.seq == last for e in events) and not fresh:
            # The answer to a nudge (it asks for the last event again): the Hands have the
            # execution, which has nothing new yet. Not a silence that counts towards giving up.
            await conn.execute("UPDATE executions SET nudges = 0 WHERE id = $1", row["id"])
        if not fresh:
            return None
        if ExecutionStatus(row["status"]) in TERMINAL_EXECUTION:
            await self._late(conn, row, fresh, touched)
            return None
        ready: list[Any] = []
        for event in fresh:  # the contiguous prefix from the next expected seq
            if event.seq != last + 1 + len(ready):
                break
            ready.append(event)
        beyond = fresh[len(ready) :]
        drained: list[int] = []
        if ready and row["holding"]:
            held = await conn.fetch(
                "SELECT seq, payload FROM held_events WHERE execution_id = $1 AND seq > $2 ORDER BY seq",
                row["id"],
                ready[-1].seq,
            )
            payloads = {r["seq"]: bytes(r["payload"]) for r in held}
            drained = drainable(ready[-1].seq, list(payloads))
            ready += [decode(payloads[seq]) for seq in drained]
            beyond = [e for e in beyond if e.seq > ready[-1].seq]
        plan = None
        if ready:
            done = effect(ExecutionStatus(row["status"]), ready, Execution.of(row))  # raises before any write
            # Held events this apply covered go, whether they drained from the held rows or came
            # again in this batch (a replay answers with the whole range from the gap on).
            await self._rare_writes(conn, row, done, ready[-1].seq if row["holding"] else None)
            turn = touched.turn(row)
            turn.facts += done.facts
            if done.terminal or (done.status is ExecutionStatus.UNKNOWN and row["turn_cancelling"]):
                turn.step_done = row["tool_step"]
                turn.finished.append(row["id"])
            plan = Planned(row, done)
        await self._hold(conn, row["id"], beyond)
        return plan

    async def _hold(self, conn: Connection, execution_id: str, beyond: Sequence[Any]) -> None:
        """Keep events ahead of a gap durably: applied once the gap is filled."""
        for event in beyond:
            await conn.execute(
                "INSERT INTO held_events (execution_id, seq, payload) VALUES ($1, $2, $3)"
                " ON CONFLICT DO NOTHING",
                execution_id,
                event.seq,
                encode(event),
            )
        if beyond:
            await conn.execute("UPDATE executions SET holding = true WHERE id = $1", execution_id)

    async def _rare_writes(self, conn: Connection, row: Any, done: Effect, covered: int | None) -> None:
        """Output pages, held events up to ``covered`` (the last seq now applied, when the row was
        holding any), and a turn's note of why it waits for a reconcile."""
        for offset, data in done.pages:
            await conn.execute(
                "INSERT INTO execution_output (execution_id, byte_offset, data) VALUES ($1, $2, $3)"
                " ON CONFLICT DO NOTHING",
                row["id"],
                offset,
                data,
            )
        if covered is not None:
            await conn.execute(
                "DELETE FROM held_events WHERE execution_id = $1 AND seq <= $2", row["id"], covered
            )
            await conn.execute(
                "UPDATE executions SET holding = EXISTS (SELECT 1 FROM held_events WHERE execution_id = $1)"
                " WHERE id = $1",
                row["id"],
            )
        if done.asked is not None:  # a question for a person (brain.store.inputs)
            await self.store.inputs.ask(conn, row, done)
        if done.unknown_reason is not None:
            await conn.execute(
                "UPDATE turns SET waiting_for = $2 WHERE id = $1",
                row["turn_id"],
                f"reconcile of execution {row['id']} ({row['tool']} {row['call_id']}): {done.unknown_reason}",
            )

    async def _late(self, conn: Connection, row: Any, fresh: Sequence[Any], touched: Touched) -> None:
        """Events for an execution the Brain settled already (its turn ended first): its status
        stays; an outcome reported after a cancel is kept beside it (with what it says)."""
        if row["status"] != ExecutionStatus.CANCELLED:
            log.warning(
                "late_event", execution_id=row["id"], status=row["status"], kinds=[e.kind for e in fresh]
            )
            return  # nothing comes after a final event of the Hands' own: not theirs to change
        sets: dict[str, Any] = {"error": row["error"]}
        for event in fresh:
            log.warning(
                "late_event", execution_id=row["id"], status=row["status"], kind=event.kind, seq=event.seq
            )
            note = late_note(row["status"], sets["error"], event)
            if note is None:
                continue
            if event.kind in ("succeeded", "failed"):
                body = event.body
                sets.update(how=body.how, evidence=body.evidence, output_bytes=body.output_bytes)
                if event.kind == "succeeded":
                    sets["result"] = Json(body.result)
            sets["error"] = note
            how = getattr(event.body, "how", None)
            touched.turn(row).facts.append(
                facts.reported_late(row["id"], row["call_id"], row["tool"], event.kind, how)
            )
        assigned = ", ".join(f"{c} = ${i + 3}" for i, c in enumerate(sets))
        await conn.execute(
            f"UPDATE executions SET last_seq = $2, {assigned} WHERE id = $1",
            row["id"],
            fresh[-1].seq,
            *sets.values(),
        )

    async def _commit_apply(
        self,
        conn: Connection,
        planned: Sequence[Planned],
        touched: Touched,
        wake_channel: str,
        budget: ClaimBudget | None,
    ) -> Applied:
        """Write the planned effects, then each touched turn's journal entry and the wake-ups (or
        claims) of turns whose step is done. The turns are locked since before their executions
        were read, so two siblings ending in two transactions at once cannot both miss the other:
        the later one waits for the turn, and then sees the first one's outcome."""
        for plan in planned:
            await conn.execute(
                f"""UPDATE executions SET status = $2, last_seq = $3, attempts = $4, result = $5, how = $6,
                           evidence = $7, output_bytes = $8, error = $9, worker = $10, {_PROGRESS}
                     WHERE id = $1""",
                plan.row["id"],
                *effect_values(plan.row, plan.effect),
            )
        applied = Applied(refused=[])
        hint = False
        for turn_id in sorted(touched):
            turn = touched[turn_id]
            if turn.step_done is not None:
                owner = budget.owner if budget is not None and budget.take() else None
                lease = budget.lease_seconds if budget is not None else 0.0
                rec = await conn.fetchrow(_WAKE, turn_id, turn.step_done, owner, lease)
                if rec is not None:
                    woken = TurnRow.from_record(rec)
                    turn.status, turn.phase = woken.status, woken.phase
                    applied.woken += 1
                    if woken.lease_owner is None:
                        hint = True
                        if owner is not None and budget is not None:
                            budget.left += 1  # not claimed (controls wait for it): the slot stays free
                    else:
                        ids = await self.store.executions.step_execution_ids(conn, turn_id, turn.step_done)
                        turn.facts += [
                            facts.run_started(woken.runs, woken.lease_epoch, "wait_tools", woken.lease_owner),
                            facts.results_applied(ids),
                        ]
                        turn.run = woken.lease_epoch
                        applied.claimed.append(woken)
                elif owner is not None and budget is not None:
                    budget.left += 1  # not taken: the slot stays free
            if turn.facts:
                seq = await self.store.journal.append(
                    conn, turn.session_id, turn_id, turn.facts, thread_id=turn.thread_id, run=turn.run,
                    status=turn.status, phase=turn.phase,
                )  # fmt: skip
                if turn.run is not None:
                    applied.entries[turn_id] = (seq, turn.facts)
        if hint:
            await conn.execute("SELECT pg_notify($1, '')", wake_channel)
        return applied

    async def wake_if_settled(
        self, conn: Connection, turn_id: str, tool_step: int, wake_channel: str
    ) -> bool:
        """Wake a waiting turn whose step is settled now (claimable: a claim takes it on)."""
        if await conn.fetchrow(_WAKE, turn_id, tool_step, None, 0.0) is None:
            return False
        await conn.execute("SELECT pg_notify($1, '')", wake_channel)
        return True


def _named(row: Row | None, first: Any) -> Row:
    """The execution events name, refused when it is not there or not theirs (their scope and
    request digest are its own)."""
    if row is None:
        raise NotFoundError(f"event for unknown execution {first.execution_id}")
    if row["session_id"] != session_key(first.namespace, first.session_id):  # the key holds both
        raise RoutingError(f"event for execution {first.execution_id} claims scope {first.scope}, "
                           f"but it belongs to {row['session_id']}")  # fmt: skip
    if row["request_digest"] != first.request_digest:
        raise ConflictError(f"event for execution {first.execution_id} carries a foreign request digest")
    return row
