"""Controls on the Brain's side: the durable record of each (its receipt), and the changes of a
turn that a control makes at once (a pause, a resume, a cancel) or that begin a cancel which ends
once the turn's executions are settled; and what a person's answer does to a call that waited
for one.

Every change here is made under the turn's row lock, in the caller's transaction, with the
journal entry that says what the control did.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from brain.rules import facts
from brain.rules.records import Control, TurnRow
from brain.rules.states import WAITING_FOR_A_PERSON, ControlStatus, ExecutionStatus, TurnPhase, TurnStatus
from brain.store.part import Part
from brain.store.sql import CONTROL_COLUMNS, control_becomes, execution_becomes, turn_becomes
from infra.db import Connection
from infra.transport import Topology

_PAUSED = turn_becomes(TurnStatus.PAUSED)
_RESUMED = turn_becomes(TurnStatus.RUNNING, from_={TurnStatus.PAUSED})
_CANCELLED = turn_becomes(TurnStatus.CANCELLED)
_CANCELLING = turn_becomes(TurnStatus.WAITING)  # until its executions are settled
_REJECTED = control_becomes(ControlStatus.REJECTED)  # the turn ended before they were applied
# A call that waited for a person: approved (then sent), or never sent (its turn was cancelled).
_APPROVED = execution_becomes(ExecutionStatus.INTENDED, from_=WAITING_FOR_A_PERSON)
_NEVER_SENT = execution_becomes(ExecutionStatus.CANCELLED, from_=WAITING_FOR_A_PERSON)
# A call no Hands worker accepted (as far as the Brain heard), settled by a cancel of its turn.
_NOT_ACCEPTED = execution_becomes(ExecutionStatus.CANCELLED, from_={ExecutionStatus.INTENDED})
NOT_ACCEPTED_REASON = "its turn was cancelled before any Hands worker accepted it"
# ... or answered by hand: a manual tool's result, or a denial.
_ANSWERED = {
    str(s): execution_becomes(s, from_=WAITING_FOR_A_PERSON)
    for s in (ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED)
}


class Controls(Part):
    async def control_by_request(self, conn: Connection, turn_id: str, request_id: str) -> Any:
        return await conn.fetchrow(
            f"SELECT {CONTROL_COLUMNS} FROM controls WHERE turn_id = $1 AND request_id = $2",
            turn_id,
            request_id,
        )

    async def control_by_id(self, conn: Connection, turn_id: str, control_id: int) -> Any:
        return await conn.fetchrow(
            f"SELECT {CONTROL_COLUMNS} FROM controls WHERE turn_id = $1 AND id = $2", turn_id, control_id
        )

    async def controls_of(self, conn: Connection, turn_id: str, *, received_only: bool = False) -> list[Any]:
        """A turn's controls in the order they came (only those not decided yet, with
        ``received_only``)."""
        only = " AND status = 'received'" if received_only else ""
        return list(
            await conn.fetch(
                f"SELECT {CONTROL_COLUMNS} FROM controls WHERE turn_id = $1{only} ORDER BY id", turn_id
            )
        )

    async def record_control(
        self, conn: Connection, turn_id: str, request_id: str, kind: str, input_digest: str, body: Any,
        status: str, reason: str | None,
    ) -> Any:  # fmt: skip
        """Record a control with its first status (``received`` for one decided later)."""
        decided = "now()" if status != "received" else "NULL"
        return await conn.fetchrow(
            f"""INSERT INTO controls (turn_id, request_id, kind, input_digest, body, status, reason,
                                     decided_at)
                VALUES ($1, $2, $3, $4, $5, $6, $7, {decided}) RETURNING {CONTROL_COLUMNS}""",
            turn_id, request_id, kind, input_digest, body, status, reason,
        )  # fmt: skip

    async def decide_controls(
        self, conn: Connection, ids: Sequence[int], status: str, reason: str | None
    ) -> None:
        """Decide controls that were received: applied, rejected or withdrawn."""
        decided = control_becomes(ControlStatus(status))
        for control_id in ids:
            await conn.execute(
                f"UPDATE controls SET {decided.set}, reason = $2, decided_at = now()"
                f" WHERE id = $1 AND {decided.guard}",
                control_id,
                reason,
            )

    async def add_pending(self, conn: Connection, turn_id: str, delta: int) -> None:
        """Count controls a boundary of the turn still has to decide."""
        await conn.execute(
            "UPDATE turns SET pending = CASE WHEN pending + $2 < 0 THEN 0 ELSE pending + $2 END"
            " WHERE id = $1",
            turn_id,
            delta,
        )

    # ---- what a control does to its turn at once ----------------------------------------------

    async def pause_now(self, conn: Connection, turn: TurnRow) -> None:
        """An unleased turn stops where it is: it takes tool results, but no run takes it."""
        await conn.execute(
            f"""UPDATE turns SET {_PAUSED.set}, waiting_for = 'a resume', revision = revision + 1,
                      updated_at = now() WHERE id = $1 AND {_PAUSED.guard}""",
            turn.id,
        )

    async def resume_now(self, conn: Connection, turn: TurnRow, wake_channel: str) -> None:
        """A paused turn goes on from where it stopped: claimable at once."""
        await conn.execute(
            f"""UPDATE turns SET {_RESUMED.set}, waiting_for = NULL, wake_at = now(),
                      revision = revision + 1, updated_at = now() WHERE id = $1 AND {_RESUMED.guard}""",
            turn.id,
        )
        await conn.execute("SELECT pg_notify($1, '')", wake_channel)

    async def cancel_now(self, conn: Connection, turn: TurnRow, why: str | None) -> list[dict[str, Any]]:
        """The turn ends CANCELLED; a run that held it is fenced out (its epoch moved on). Returns
        the facts that close its dispatched calls (:meth:`closing`)."""
        await conn.execute(
            f"""UPDATE turns SET {_CANCELLED.set}, lease_owner = NULL, lease_expires_at = NULL,
                       lease_epoch = lease_epoch + 1, waiting_for = NULL, cancel_requested = false,
                       pending = 0, revision = revision + 1, updated_at = now()
                 WHERE id = $1 AND {_CANCELLED.guard}""",
            turn.id,
        )
        await self._never_sent(conn, turn.id)
        return await self.closing(conn, turn.id, turn.phase, turn.tool_step, why)

    async def closing(
        self, conn: Connection, turn_id: str, phase: str, tool_step: int, why: str | None
    ) -> list[dict[str, Any]]:
        """What closes the calls of a turn that ends (cancelled) before the results of its step
        went to the model: those executions' outcomes applied, as they stand (settled by then:
        cancelled, or what they did before the cancel reached them), so that the thread's next
        model call sees no call without its result (``brain.rules.history``). A cancelled one that
        does not say why (its Hands stopped it, or it never left the Brain) says ``why`` (the
        cancel's reason; "its turn was cancelled" without one). ``phase`` and ``tool_step``: the
        turn's, as its end found them (a failed turn's too: ``brain.store.failures``)."""
        if phase not in (TurnPhase.WAIT_TOOLS, TurnPhase.APPLY_RESULTS):
            return []
        await conn.execute(
            "UPDATE executions SET error = $3, updated_at = now()"
            " WHERE turn_id = $1 AND tool_step = $2 AND status = 'cancelled' AND error IS NULL",
            turn_id, tool_step, {"code": "cancelled", "message": why or "its turn was cancelled"},
        )  # fmt: skip
        ids = await self.store.executions.step_execution_ids(conn, turn_id, tool_step)
        return [facts.results_applied(ids)] if ids else []

    async def settle_not_accepted(
        self, conn: Connection, turn: TurnRow, topology: Topology, why: str | None = None
    ) -> tuple[list[Control], list[dict[str, Any]]]:
        """Settle, in a cancel's commit, the turn's executions that no Hands worker accepted as
        far as the Brain heard (INTENDED: their command may wait in a queue whose pool is down):
        CANCELLED, their command never sent again, and a cancel to their route, which leaves a
        tombstone there so that the command, when a worker takes it, never runs. So the cancel
        does not wait for a pool. If a worker did accept one meanwhile (its events on their way),
        the cancel reaches it as it reaches any accepted call (a body not started never starts, a
        running one is asked to stop), and what its Hands report afterwards is kept as a late
        note. ``why``: what the calls' error says (the model reads it when their turn's calls are
        closed), NOT_ACCEPTED_REASON unless given. Returns the cancels (in the outbox) and the facts."""
        why = why or NOT_ACCEPTED_REASON
        error = {"code": "cancelled", "message": why}
        rows = await conn.fetch(
            f"""UPDATE executions SET {_NOT_ACCEPTED.set}, error = $2, holding = false, command = NULL,
                       updated_at = now()
                 WHERE turn_id = $1 AND {_NOT_ACCEPTED.guard}
             RETURNING id, route, request_digest, call_id, tool""",
            turn.id,
            error,
        )
        controls, said = [], []
        for e in sorted(rows, key=lambda r: r["id"]):
            controls.append(
                await self.store.outbox.add_cancel(conn, topology, turn.namespace, turn.session_id, e, why)
            )
            said.append(facts.cancelled(e["id"], e["call_id"], e["tool"], why))
            await conn.execute("DELETE FROM held_events WHERE execution_id = $1", e["id"])
        return controls, said

    async def interrupt_at_boundary(
        self, conn: Connection, row: TurnRow, topology: Topology
    ) -> list[Control] | None:
        """A run committed a reply whose calls it has not sent (``row``: the turn as that commit left
        it), and a new message's interrupt came during its model call (``brain.rules.controls.
        at_boundary``): the turn ends here, the reply kept, its calls settled as never sent (a
        tombstone to their routes) and closed with that outcome. Returns the cancels to send; None
        when there is no such interrupt, or the turn moved on since."""
        turn = await self.store.turns.lock_turn(conn, row.namespace, row.id)
        cancels = [
            c for c in await self.controls_of(conn, row.id, received_only=True) if c["kind"] == "cancel"
        ]
        if turn is None or turn.revision != row.revision or not cancels:
            return None
        why = cancels[0]["reason"]
        controls, said = await self.settle_not_accepted(conn, turn, topology, why)
        said += await self.cancel_now(conn, turn, why)
        await self.decide_controls(conn, [c["id"] for c in cancels], "applied", why)
        said += [facts.control(c["id"], "cancel", "applied", why) for c in cancels]
        said += await self.reject_received(conn, turn.id, "the turn was cancelled")
        said.append(facts.cancelled_turn())
        await self.store.journal.append(
            conn, turn.session_id, turn.id, said, thread_id=turn.thread_id, status="cancelled",
            phase=str(turn.phase),
        )  # fmt: skip
        return controls

    async def begin_cancel(
        self, conn: Connection, turn: TurnRow, accepted: Sequence[Any], topology: Topology, reason: str
    ) -> list[Control]:
        """A turn with executions a Hands worker accepted (and those not accepted settled already:
        :meth:`settle_not_accepted`) is cancelling: fenced (a run in progress dispatches nothing
        more), waiting until each is settled, while a cancel goes to each one's Hands. Returns the
        cancels, in the outbox."""
        await conn.execute(
            f"""UPDATE turns SET {_CANCELLING.set}, cancel_requested = true, lease_owner = NULL,
                      lease_expires_at = NULL, lease_epoch = lease_epoch + 1, revision = revision + 1,
                      waiting_for = $2, wake_at = now(), updated_at = now()
                WHERE id = $1 AND {_CANCELLING.guard}""",
            turn.id,
            f"{len(accepted)} execution(s) to settle after a cancel",
        )
        controls = [
            await self.store.outbox.add_cancel(conn, topology, turn.namespace, turn.session_id, e, reason)
            for e in accepted
        ]
        await self._never_sent(conn, turn.id)
        return controls

    async def _never_sent(self, conn: Connection, turn_id: str) -> None:
        """Calls that waited for a person, whose turn was cancelled: never sent to any Hands."""
        await conn.execute(
            f"UPDATE executions SET {_NEVER_SENT.set}, command = NULL, wait_until = NULL, updated_at = now()"
            f" WHERE turn_id = $1 AND {_NEVER_SENT.guard}",
            turn_id,
        )

    # ---- what a person's answer does to a PENDING execution ------------------------------------

    async def approve(self, conn: Connection, turn_id: str, execution_id: str) -> None:
        """An approved call becomes INTENDED with no living creator: the repair scan, told to look
        at its turn now, sends its command at once."""
        await conn.execute(
            f"""UPDATE executions SET {_APPROVED.set}, how = NULL, created_by = NULL, updated_at = now()
                WHERE id = $1 AND {_APPROVED.guard}""",
            execution_id,
        )
        await conn.execute("UPDATE turns SET wake_at = now() WHERE id = $1 AND status = 'waiting'", turn_id)

    async def settle_by_hand(
        self,
        conn: Connection,
        execution: Any,
        *,
        status: str,
        how: str,
        result: Any,
        error: Any,
        evidence: str,
        wake_channel: str,
    ) -> None:
        """A person answered (a manual tool's result) or denied a PENDING execution, or a built-in
        wait's clock or signal came: it is final, and its turn goes on if that settled its step."""
        await conn.execute(
            f"""UPDATE executions SET {_ANSWERED[status].set}, how = $2, result = $3, error = $4,
                      evidence = $5, command = NULL, wait_until = NULL, updated_at = now()
                WHERE id = $1 AND {_ANSWERED[status].guard}""",
            execution["id"], how, result, error, evidence,
        )  # fmt: skip
        await self.store.events.wake_if_settled(
            conn, execution["turn_id"], execution["tool_step"], wake_channel
        )

    async def reject_received(self, conn: Connection, turn_id: str, reason: str) -> list[dict[str, Any]]:
        """Reject the controls of a turn that ended before they could be applied; their facts."""
        rows = await conn.fetch(
            f"""UPDATE controls SET {_REJECTED.set}, reason = $2, decided_at = now()
                WHERE turn_id = $1 AND {_REJECTED.guard} RETURNING id, kind""",
            turn_id,
            reason,
        )
        if rows:
            await conn.execute("UPDATE turns SET pending = 0 WHERE id = $1", turn_id)
        return [
            facts.control(r["id"], r["kind"], "rejected", reason) for r in sorted(rows, key=lambda r: r["id"])
        ]
