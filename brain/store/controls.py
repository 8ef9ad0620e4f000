"""Controls on the Brain's side: the durable record of each (its receipt), and the changes of a
turn that a control makes at once (a pause, a resume, a cancel) or that begin a cancel which ends
once the turn's executions are settled.

Every change here is made under the turn's row lock, in the caller's transaction, with the
journal entry that says what the control did.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from brain.rules.records import TERMINAL_SQL, TURN_COLUMNS, VIEW_EXECUTION_COLUMNS, Control, TurnRow, TurnView
from brain.store.repairs import UNSETTLED_SQL, RepairRows
from infra.transport import Topology
from protocol import CancelBody, CancelControl

CONTROL_COLUMNS = "id, turn_id, request_id, kind, input_digest, body, status, reason, created_at, decided_at"


class ControlRows(RepairRows):
    async def lock_turn(
        self, conn: Any, namespace: str, turn_id: str, *, lock: bool = True
    ) -> TurnRow | None:
        """The turn, locked for this transaction (unless ``lock`` is False), if it is
        ``namespace``'s."""
        locked = self.FOR_UPDATE if lock else ""
        rec = await conn.fetchrow(
            f"SELECT {TURN_COLUMNS} FROM turns WHERE id = $1 AND namespace = $2{locked}", turn_id, namespace
        )
        return TurnRow.from_record(rec) if rec is not None else None

    async def turn_view(self, conn: Any, namespace: str, turn_id: str) -> TurnView | None:
        """The turn (if it is ``namespace``'s) with its journal entries and executions: one
        statement, and so one moment, where the backend can."""
        turn = await self.lock_turn(conn, namespace, turn_id, lock=False)
        if turn is None:
            return None
        entries = await self.entries(conn, turn.session_id, turn_id=turn_id, limit=100_000)
        rows = await conn.fetch(
            f"SELECT {VIEW_EXECUTION_COLUMNS} FROM executions WHERE turn_id = $1 ORDER BY tool_step, call_id",
            turn_id,
        )
        return TurnView(turn, entries, [dict(r) for r in rows])

    async def status_of(self, conn: Any, turn_id: str) -> str:
        return str(await conn.fetchval("SELECT status FROM turns WHERE id = $1", turn_id))

    async def control_by_request(self, conn: Any, turn_id: str, request_id: str) -> Any:
        return await conn.fetchrow(
            f"SELECT {CONTROL_COLUMNS} FROM controls WHERE turn_id = $1 AND request_id = $2",
            turn_id,
            request_id,
        )

    async def control_by_id(self, conn: Any, turn_id: str, control_id: int) -> Any:
        return await conn.fetchrow(
            f"SELECT {CONTROL_COLUMNS} FROM controls WHERE turn_id = $1 AND id = $2", turn_id, control_id
        )

    async def controls_of(self, conn: Any, turn_id: str, *, received_only: bool = False) -> list[Any]:
        """A turn's controls in the order they came (only those not decided yet, with
        ``received_only``)."""
        only = " AND status = 'received'" if received_only else ""
        return list(
            await conn.fetch(
                f"SELECT {CONTROL_COLUMNS} FROM controls WHERE turn_id = $1{only} ORDER BY id", turn_id
            )
        )

    async def record_control(
        self, conn: Any, turn_id: str, request_id: str, kind: str, input_digest: str, body: Any,
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

    async def decide_controls(self, conn: Any, ids: Sequence[int], status: str, reason: str | None) -> None:
        """Decide controls that were received: applied, rejected or withdrawn."""
        for control_id in ids:
            await conn.execute(
                "UPDATE controls SET status = $2, reason = $3, decided_at = now()"
                " WHERE id = $1 AND status = 'received'",
                control_id,
                status,
                reason,
            )

    async def add_pending(self, conn: Any, turn_id: str, delta: int) -> None:
        """Count controls a boundary of the turn still has to decide."""
        await conn.execute(
            "UPDATE turns SET pending = CASE WHEN pending + $2 < 0 THEN 0 ELSE pending + $2 END"
            " WHERE id = $1",
            turn_id,
            delta,
        )

    async def open_executions(self, conn: Any, turn_id: str) -> list[Any]:
        """A turn's executions that are not settled (UNKNOWN ones are: only a reconcile moves them)."""
        return list(
            await conn.fetch(
                f"""SELECT id, route, request_digest, call_id, tool, status FROM executions
                     WHERE turn_id = $1 AND status IN {UNSETTLED_SQL} ORDER BY id""",
                turn_id,
            )
        )

    # ---- what a control does to its turn at once ----------------------------------------------

    async def pause_now(self, conn: Any, turn: TurnRow) -> None:
        """An unleased turn stops where it is: it takes tool results, but no run takes it."""
        await conn.execute(
            """UPDATE turns SET status = 'paused', waiting_for = 'a resume', revision = revision + 1,
                      updated_at = now() WHERE id = $1""",
            turn.id,
        )

    async def resume_now(self, conn: Any, turn: TurnRow, wake_channel: str) -> None:
        """A paused turn goes on from where it stopped: claimable at once."""
        await conn.execute(
            """UPDATE turns SET status = 'running', waiting_for = NULL, wake_at = now(),
                      revision = revision + 1, updated_at = now() WHERE id = $1 AND status = 'paused'""",
            turn.id,
        )
        await conn.execute("SELECT pg_notify($1, '')", wake_channel)

    async def cancel_now(self, conn: Any, turn: TurnRow) -> None:
        """The turn ends CANCELLED; a run that held it is fenced out (its epoch moved on)."""
        await conn.execute(
            f"""UPDATE turns SET status = 'cancelled', lease_owner = NULL, lease_expires_at = NULL,
                       lease_epoch = lease_epoch + 1, waiting_for = NULL, cancel_requested = false,
                       pending = 0, revision = revision + 1, updated_at = now()
                 WHERE id = $1 AND status NOT IN {TERMINAL_SQL}""",
            turn.id,
        )
        await conn.execute(
            "UPDATE executions SET status = 'cancelled', command = NULL, updated_at = now()"
            " WHERE turn_id = $1 AND status = 'pending'",
            turn.id,
        )

    async def begin_cancel(
        self, conn: Any, turn: TurnRow, open_executions: Sequence[Any], topology: Topology, reason: str
    ) -> list[Control]:
        """A turn with executions still open is cancelling: fenced (a run in progress dispatches
        nothing more), waiting until each is settled, while a cancel goes to each one's Hands (a
        command they have not run yet then never runs). Returns the cancels, in the outbox."""
        await conn.execute(
            """UPDATE turns SET status = 'waiting', cancel_requested = true, lease_owner = NULL,
                      lease_expires_at = NULL, lease_epoch = lease_epoch + 1, revision = revision + 1,
                      waiting_for = $2, wake_at = now(), updated_at = now() WHERE id = $1""",
            turn.id,
            f"{len(open_executions)} execution(s) to settle after a cancel",
        )
        controls = []
        for e in open_executions:
            if e["status"] == "pending":  # never sent: nothing to tell any Hands
                continue
            control = CancelControl(
                execution_id=e["id"],
                namespace=turn.namespace,
                session_id=turn.session_id,
                request_digest=e["request_digest"],
                body=CancelBody(reason=reason),
            )
            controls.append(await self.add_control(conn, topology.controls(e["route"]), control))
        await conn.execute(
            "UPDATE executions SET status = 'cancelled', command = NULL, updated_at = now()"
            " WHERE turn_id = $1 AND status = 'pending'",
            turn.id,
        )
        return controls

    # ---- what a person's answer does to a PENDING execution ------------------------------------

    async def execution_for_call(self, conn: Any, turn_id: str, call: str) -> Any:
        """The turn's execution of a call, by call id or execution id."""
        return await conn.fetchrow(
            """SELECT id, turn_id, call_id, tool, status, how, tool_step FROM executions
                WHERE turn_id = $1 AND (call_id = $2 OR id = $2) ORDER BY tool_step DESC LIMIT 1""",
            turn_id,
            call,
        )

    async def approve(self, conn: Any, turn_id: str, execution_id: str) -> None:
        """An approved call becomes INTENDED with no living creator: the repair scan, told to look
        at its turn now, sends its command at once."""
        await conn.execute(
            """UPDATE executions SET status = 'intended', how = NULL, created_by = NULL, updated_at = now()
                WHERE id = $1 AND status = 'pending'""",
            execution_id,
        )
        await conn.execute("UPDATE turns SET wake_at = now() WHERE id = $1 AND status = 'waiting'", turn_id)

    async def settle_by_hand(
        self, conn: Any, execution: Any, *, status: str, how: str, result: Any, error: Any, evidence: str,
        wake_channel: str,
    ) -> None:  # fmt: skip
        """A person answered (a manual tool's result) or denied a PENDING execution: it is final, and
        its turn goes on if that settled its step."""
        await conn.execute(
            """UPDATE executions SET status = $2, how = $3, result = $4, error = $5, evidence = $6,
                      command = NULL, updated_at = now() WHERE id = $1 AND status = 'pending'""",
            execution["id"], status, how, result, error, evidence,
        )  # fmt: skip
        await self.wake_if_settled(conn, execution["turn_id"], execution["tool_step"], wake_channel)
