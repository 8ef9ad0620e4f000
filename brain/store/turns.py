"""Turn rows: claims under a lease with an epoch, the fenced moves of runs, and reads of a turn
(submits are ``brain.store.submits``).

The portable statements, one turn at a time; ``turns_pg`` does the same for many turns per
statement.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, NoReturn

from brain.rules import facts
from brain.rules.messages import superseded_by_loss
from brain.rules.records import Claimed, Move, Moved, TurnRow
from brain.rules.states import TurnPhase, TurnStatus, phase_transition, turn_transition
from brain.store.part import Part
from brain.store.sql import TERMINAL_SQL, TURN_COLUMNS, owner_not_dead, turn_becomes
from infra.db import Connection
from infra.db.store import as_time
from protocol import NotFoundError, StaleOwnerError

# A claim takes a queued turn, or a running one whose run was lost, for a new run.
CLAIMED = turn_becomes(TurnStatus.RUNNING, from_={TurnStatus.QUEUED, TurnStatus.RUNNING}, alias="t")
# Turns that waited for their tools' bindings look again once tools are announced.
_WOKEN = turn_becomes(TurnStatus.RUNNING, from_={TurnStatus.WAITING})

# Claimable: queued or running, due, not under a live lease, first unfinished in its thread.
# A lease is live until it runs out; the owner renews it while its run goes on, and the judgement
# that presumes an owner dead hands its turns back at once (``release_owners``). So a claim reads
# nothing but the turn's own columns.
# "First": a started turn goes before every queued one, else the earlier seq goes first. Seqs are
# handed out at insert, so two racing submits to one thread can commit out of seq order, and a
# served submit starts its turn in its own commit: a queued turn never overtakes a started one.
CLAIMABLE_FROM = f"""
    FROM turns t
    WHERE {CLAIMED.guard} AND t.wake_at <= now()
      AND (t.lease_owner IS NULL OR t.lease_expires_at < now())
      AND NOT EXISTS (
          SELECT 1 FROM turns p WHERE p.thread_id = t.thread_id AND p.id <> t.id
            AND p.status NOT IN {TERMINAL_SQL}
            AND CASE WHEN (p.status = 'queued') = (t.status = 'queued') THEN p.seq < t.seq
                     ELSE p.status <> 'queued' END)"""
CLAIMABLE_SQL = f"SELECT t.id {CLAIMABLE_FROM}"

# Where in its work a turn is, for the crash-loop limit: a phase of one model call and tool step.
CRASH_AT = "phase || '#' || model_calls || '#' || tool_step"
_RELEASE = f"""UPDATE turns SET lease_owner = NULL, lease_expires_at = NULL, updated_at = now(),
                      crashes = CASE WHEN NOT $2 THEN crashes
                                     WHEN crash_at = {CRASH_AT} THEN crashes + 1 ELSE 1 END,
                      crash_at = CASE WHEN $2 THEN {CRASH_AT} ELSE crash_at END,
                      model_attempt = model_attempt + CASE WHEN phase = 'model_request' THEN 1 ELSE 0 END
                WHERE lease_owner = $1 AND status NOT IN {TERMINAL_SQL}
            RETURNING id, session_id, thread_id, status, phase, lease_epoch, model_calls, model_attempt"""

# Waiting turns with a command a dead (or retired) Brain committed but may never have published:
# the repair scan looks at them now, not when their stall time comes (it sends such a command at
# once when its Brain is gone).
_LOOK_NOW = """UPDATE turns SET wake_at = now()
                 WHERE status = 'waiting' AND phase = 'wait_tools' AND wake_at > now()
                   AND EXISTS (SELECT 1 FROM executions e
                                WHERE e.turn_id = turns.id AND e.tool_step = turns.tool_step
                                  AND e.status = 'intended' AND e.created_by = $1)"""

CLAIM_SET = f"""lease_owner = $1, lease_epoch = lease_epoch + 1, runs = runs + 1,
               lease_expires_at = ts_add(now(), $2), {CLAIMED.set}, revision = revision + 1,
               updated_at = now()"""

# A move: the new values, guarded by the turn as the mover knew it.
MOVE_SET = """status = $7, phase = $8, waiting_for = $9, model_calls = $10, tool_step = $11, retries = $12,
              result = $13, error = $14,
              lease_owner = CASE WHEN $15 THEN NULL ELSE lease_owner END,
              lease_expires_at = CASE WHEN $15 THEN NULL ELSE ts_add(now(), $16) END,
              wake_at = CASE WHEN $17 IS NULL THEN wake_at ELSE ts_add(now(), $17) END,
              model_attempt = $18, revision = revision + 1, updated_at = now()"""
MOVE_GUARD = """id = $1 AND lease_owner = $2 AND lease_epoch = $3 AND status = $4 AND phase = $5
                AND revision = $6"""


def move_values(move: Move, lease_seconds: float) -> list[Any]:
    """The parameters of MOVE_GUARD and MOVE_SET, in order."""
    b = move.before
    assert b.lease_owner is not None, f"turn {b.id} is moved by a run that holds no lease"
    return [
        b.id, b.lease_owner, b.lease_epoch, b.status, b.phase, b.revision,
        move.status, move.phase, move.waiting_for, move.value("model_calls"), move.value("tool_step"),
        move.value("retries"), move.value("result"), move.value("error"),
        move.release, float(lease_seconds), move.wake_in, move.value("model_attempt"),
    ]  # fmt: skip


class Turns(Part):
    # ---- claims ------------------------------------------------------------------------

    async def anything_claimable(self) -> bool:
        """A cheap look before opening a claim transaction."""
        return bool(await self.store.read(lambda c: c.fetchval(f"SELECT EXISTS ({CLAIMABLE_SQL})")))

    async def claim(self, conn: Connection, owner: str, lease_seconds: float, limit: int) -> Claimed:
        """Claim up to ``limit`` turns for new runs (inside the caller's transaction)."""
        rows: list[TurnRow] = []
        now = None
        for _ in range(limit):
            rec = await conn.fetchrow(
                f"""UPDATE turns SET {CLAIM_SET}
                     WHERE id = ({CLAIMABLE_SQL} ORDER BY t.wake_at, t.seq LIMIT 1) AND {owner_not_dead("$1")}
                 RETURNING {TURN_COLUMNS}, now() AS now""",
                owner,
                lease_seconds,
            )
            if rec is None:
                return Claimed(rows, False, now)
            now = as_time(rec["now"])
            rows.append(TurnRow.from_record(rec))
        more = bool(await conn.fetchval(f"SELECT EXISTS ({CLAIMABLE_SQL}) AND {owner_not_dead('$1')}", owner))
        return Claimed(rows, more, now)

    async def renew_leases(
        self, conn: Connection, owner: str, turn_ids: Collection[str], lease_seconds: float
    ) -> None:
        """Extend the leases ``owner`` holds on ``turn_ids`` (its runs in progress)."""
        for turn_id in turn_ids:
            await conn.execute(
                "UPDATE turns SET lease_expires_at = ts_add(now(), $3) WHERE id = $2 AND lease_owner = $1",
                owner,
                turn_id,
                lease_seconds,
            )

    async def release_owners(
        self, conn: Connection, owners: Sequence[str], wake_channel: str, *, died: bool = True
    ) -> int:
        """Hand back the turns of Brains presumed dead (or retiring, ``died`` False): claimable at
        once, their runs fenced out, each run's end journaled (a model call it was making is lost).
        A death counts towards the turn's crash-loop limit when it came at the same point of the
        turn's work as the one before; the waiting turns with commands they committed are looked
        at now (``_LOOK_NOW``). Returns how many turns were handed back."""
        released = 0
        for owner in owners:
            rows = await conn.fetch(_RELEASE, owner, died)
            for r in rows:
                lost = [facts.run_lost(r["lease_epoch"], r["phase"], died=died)]
                if r["phase"] == TurnPhase.MODEL_REQUEST:  # the model call it was making is void
                    lost.append(superseded_by_loss(r["id"], r["model_calls"], r["model_attempt"], died=died))
                await self.store.journal.append(
                    conn, r["session_id"], r["id"], lost, thread_id=r["thread_id"], status=r["status"],
                    phase=r["phase"],
                )  # fmt: skip
            released += len(rows)
            await conn.execute(_LOOK_NOW, owner)
        if released:
            await conn.execute("SELECT pg_notify($1, '')", wake_channel)
        return released

    async def wake_for_bindings(self, conn: Connection, wake_channel: str) -> int:
        """Tools were announced: turns waiting for bindings look again (each checks its own)."""
        woken = await conn.fetch(
            f"""UPDATE turns SET {_WOKEN.set}, wake_at = now(), waiting_for = NULL, updated_at = now()
                WHERE {_WOKEN.guard} AND phase = 'prepare' RETURNING id"""
        )
        if woken:
            await conn.execute("SELECT pg_notify($1, '')", wake_channel)
        return len(woken)

    # ---- moves -------------------------------------------------------------------------

    async def commit_moves(
        self, conn: Connection, moves: Sequence[Move], lease_seconds: float
    ) -> list[Moved | None]:
        """Commit each move whole (turn, journal entry, executions, frozen bindings) inside the
        caller's transaction; None for a move its guard refused (nothing of it is written)."""
        return [await self._commit_move(conn, move, lease_seconds) for move in moves]

    async def _commit_move(self, conn: Connection, move: Move, lease_seconds: float) -> Moved | None:
        rec = await conn.fetchrow(
            f"UPDATE turns SET {MOVE_SET} WHERE {MOVE_GUARD} RETURNING {TURN_COLUMNS}",
            *move_values(move, lease_seconds),
        )
        if rec is None:
            return None
        row = TurnRow.from_record(rec)
        seq = None
        if move.facts:
            seq = await self.store.journal.append(
                conn, row.session_id, row.id, list(move.facts), thread_id=row.thread_id,
                run=move.before.lease_epoch, status=row.status, phase=row.phase,
            )  # fmt: skip
        for i in move.intents:
            await conn.execute(
                """INSERT INTO executions (id, turn_id, tool_step, call_id, route, tool, binding_digest,
                                           replay_policy, request_digest, status, command_message_id,
                                           command, created_by, journal_detail, error, how, wait_key,
                                           wait_until)
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                           ts_add(now(), $18))""",
                i.execution_id, row.id, i.tool_step, i.call_id, i.route, i.tool, i.binding_digest,
                i.replay_policy, i.request_digest, i.status, i.command_message_id, i.command,
                move.before.lease_owner, i.journal_detail, i.error, i.how, i.wait_key, i.wait_seconds,
            )  # fmt: skip
        froze = False
        if move.freeze is not None:
            status = await conn.execute(
                "UPDATE threads SET bindings = $2 WHERE id = $1 AND bindings IS NULL",
                row.thread_id,
                move.freeze,
            )
            froze = status.endswith(" 1")
        return Moved(row, seq, froze)

    async def refuse(self, conn: Connection, move: Move) -> NoReturn:
        """Raise why a move matched nothing: IllegalTransitionError when its owner made a move the
        tables forbid, else StaleOwnerError (another run owns the turn now, or it moved on)."""
        lease = move.before.lease
        current = await conn.fetchrow(
            "SELECT status, phase, lease_owner, lease_epoch FROM turns WHERE id = $1", lease.turn_id
        )
        if current is not None and (current["lease_owner"], current["lease_epoch"]) == (
            lease.owner,
            lease.epoch,
        ):
            if move.phase != TurnPhase(current["phase"]):
                phase_transition(TurnPhase(current["phase"]), move.phase)
            if move.status != current["status"]:
                turn_transition(TurnStatus(current["status"]), move.status)
        raise StaleOwnerError(
            f"turn {lease.turn_id}: run epoch {lease.epoch} of {lease.owner} no longer owns it"
        )

    # ---- reads -------------------------------------------------------------------------

    async def load(self, conn: Connection, turn_id: str) -> TurnRow:
        rec = await conn.fetchrow(f"SELECT {TURN_COLUMNS} FROM turns WHERE id = $1", turn_id)
        if rec is None:
            raise NotFoundError(f"no turn {turn_id!r}")
        return TurnRow.from_record(rec)

    async def find_turn(self, conn: Connection, session_id: str, request_id: str) -> TurnRow | None:
        """The turn a session's request id made, if any (``session_id``: the store's key of it)."""
        rec = await conn.fetchrow(
            f"SELECT {TURN_COLUMNS} FROM turns WHERE session_id = $1 AND request_id = $2",
            session_id,
            request_id,
        )
        return TurnRow.from_record(rec) if rec is not None else None

    async def statuses(self, turn_ids: Sequence[str]) -> dict[str, str]:
        async def work(conn: Connection) -> dict[str, str]:
            found = {}
            for turn_id in turn_ids:
                status = await conn.fetchval("SELECT status FROM turns WHERE id = $1", turn_id)
                if status is not None:
                    found[turn_id] = status
            return found

        return await self.store.read(work)

    async def lock_turn(
        self, conn: Connection, namespace: str, turn_id: str, *, lock: bool = True
    ) -> TurnRow | None:
        """The turn, locked for this transaction (unless ``lock`` is False), if it is
        ``namespace``'s."""
        locked = self.store.FOR_UPDATE if lock else ""
        rec = await conn.fetchrow(
            f"SELECT {TURN_COLUMNS} FROM turns WHERE id = $1 AND namespace = $2{locked}", turn_id, namespace
        )
        return TurnRow.from_record(rec) if rec is not None else None

    async def unfinished_of_thread(self, conn: Connection, thread_id: str) -> list[TurnRow]:
        """A thread's unfinished turns in their order, locked for this transaction."""
        recs = await conn.fetch(
            f"SELECT {TURN_COLUMNS} FROM turns WHERE thread_id = $1 AND status NOT IN {TERMINAL_SQL}"
            f" ORDER BY seq{self.store.FOR_UPDATE}",
            thread_id,
        )
        return [TurnRow.from_record(r) for r in recs]

    async def status_of(self, conn: Connection, turn_id: str) -> str:
        return str(await conn.fetchval("SELECT status FROM turns WHERE id = $1", turn_id))
