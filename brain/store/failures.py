"""Failing a turn from outside its run (an update that cannot be verified, Hands that never
answer) or by the run that owns it, and settling the executions it leaves: each CANCELLED, with a
cancel to its Hands through the outbox in the same transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from brain.rules import facts
from brain.rules.records import Control, Lease, Settled
from brain.rules.states import UNSETTLED_EXECUTION, ExecutionStatus, TurnStatus
from brain.store.part import Part
from brain.store.sql import execution_becomes, turn_becomes
from infra.db import Connection
from infra.db.store import as_time
from infra.transport import Topology

_FAILED = turn_becomes(TurnStatus.FAILED)
_SETTLED = execution_becomes(ExecutionStatus.CANCELLED, from_=UNSETTLED_EXECUTION)


class Failures(Part):
    async def fail_turn(
        self,
        conn: Connection,
        turn_id: str,
        error: dict[str, str],
        topology: Topology,
        *,
        lease: Lease | None = None,
        wake_channel: str | None = None,
        preface: Sequence[dict[str, Any]] = (),
    ) -> Settled | None:
        """Fail a turn and settle its open executions, in the caller's transaction; None when it
        had ended already (or, with ``lease``, when that run no longer owns it).

        With ``lease`` the run that owns the turn fails it; without, something outside its run
        does (an update that cannot be verified, Hands that never answer): then the epoch moves
        on, fencing out whichever run still holds it. ``preface``: facts of the same commit that
        come first (the run a claim began, when the failure is what that claim found).
        """
        fence, owned = (
            ("lease_owner = $3 AND lease_epoch = $4", [lease.owner, lease.epoch]) if lease else ("1 = 1", [])
        )
        row = await conn.fetchrow(
            f"""UPDATE turns SET {_FAILED.set}, error = $2, lease_owner = NULL, lease_expires_at = NULL,
                       waiting_for = NULL, lease_epoch = lease_epoch + 1, revision = revision + 1,
                       updated_at = now()
                 WHERE id = $1 AND {_FAILED.guard} AND ({fence})
             RETURNING session_id, thread_id, namespace, phase, tool_step, created_at, cancel_requested""",
            turn_id,
            error,
            *owned,
        )
        if row is None:
            return None
        controls, cancelled = await self._settle_open(
            conn, turn_id, row["namespace"], row["session_id"], error, topology,
            told=bool(row["cancel_requested"]),
        )  # fmt: skip
        # Its step's calls closed before its end, as a cancel closes them (``Controls.closing``).
        closed = await self.store.controls.closing(conn, turn_id, row["phase"], row["tool_step"], None)
        written = [*preface, *closed, facts.failed(error)] + [facts.cancelled(*one) for one in cancelled]
        written += await self.store.controls.reject_received(conn, turn_id, "the turn failed first")
        await self.store.journal.append(
            conn, row["session_id"], turn_id, written, thread_id=row["thread_id"], status="failed",
            phase=row["phase"],
        )  # fmt: skip
        if wake_channel is not None:
            await conn.execute("SELECT pg_notify($1, '')", wake_channel)
        return Settled(turn_id, controls, as_time(row["created_at"]))

    async def _settle_open(
        self,
        conn: Connection,
        turn_id: str,
        namespace: str,
        session_id: str,
        error: dict[str, str],
        topology: Topology,
        *,
        told: bool = False,
    ) -> tuple[list[Control], list[tuple[str, str, str, str]]]:
        """Settle the unfinished executions of a turn that ended before them (``told``: a cancel
        of the turn sent each of them one already, which is not sent again).

        Each becomes CANCELLED here, with the turn's error, and its Hands are told: a cancel
        control goes out through the outbox in this same transaction. A command they have not
        seen yet then never runs (the cancel leaves a tombstone), a body that runs is asked to
        stop, and whatever they report afterwards is a late event the Brain leaves alone.
        UNKNOWN executions stay UNKNOWN: a reconcile may still come.
        """
        reason = f"its turn ended first ({error.get('code')}: {error.get('message')})"
        rows = await conn.fetch(
            f"""UPDATE executions SET {_SETTLED.set}, error = $2, holding = false, command = NULL,
                       wait_until = NULL, updated_at = now()
                 WHERE turn_id = $1 AND {_SETTLED.guard}
             RETURNING id, route, request_digest, call_id, tool""",
            turn_id,
            {"code": "cancelled", "message": reason},
        )
        controls: list[Control] = []
        cancelled: list[tuple[str, str, str, str]] = []  # execution, call, tool, reason
        for e in sorted(rows, key=lambda r: r["id"]):
            if not told:
                controls.append(
                    await self.store.outbox.add_cancel(conn, topology, namespace, session_id, e, reason)
                )
            cancelled.append((e["id"], e["call_id"], e["tool"], reason))
            await conn.execute("DELETE FROM held_events WHERE execution_id = $1", e["id"])
        return controls, cancelled
