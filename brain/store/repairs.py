"""Repairs and endings on the Brain's side: what the repair scan looks at (and how it counts its
nudges), how a turn that fails settles its executions, and the controls outbox.

The scan starts from the turns that wait: a waiting turn's ``wake_at`` is when to look at it
next, so the executions themselves need no index on their status or times (applying an event
stays a HOT update) and a turn whose tools answer in time is never looked at.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from brain.rules import facts
from brain.rules.records import TERMINAL_SQL, Control, Lease, Settled
from brain.store.executions import SETTLED, ExecutionRows
from infra.db.store import as_time
from infra.transport import Topology
from protocol import CancelBody, CancelControl, encode

OPEN_SQL = "('intended', 'accepted', 'running')"  # what the Hands may still be working on
UNSETTLED_SQL = "('pending', 'intended', 'accepted', 'running')"  # ... and what waits for a person


class RepairRows(ExecutionRows):
    # ---- what the scan looks at --------------------------------------------------------

    async def due_waiting(self, conn: Any, limit: int = 100) -> list[Any]:
        """Waiting turns whose time to be looked at came, locked (others skip them), with the
        executions of their current step that are not final: one row per execution, with
        ``creator_alive`` (the Brain that committed its intent still lives)."""
        turns = await conn.fetch(
            f"""SELECT id FROM turns WHERE status = 'waiting' AND phase = 'wait_tools' AND wake_at <= now()
                 ORDER BY wake_at LIMIT $1{self.SKIP_LOCKED}""",
            limit,
        )
        rows: list[Any] = []
        for t in turns:
            rows += await conn.fetch(
                f"""SELECT e.id, e.turn_id, e.status, e.last_seq, e.route, e.request_digest,
                           e.command_message_id, e.command, e.nudges, e.stall_backoff, e.created_at,
                           e.updated_at, e.replay_requested_at, t.namespace, t.session_id, now() AS now,
                           EXISTS (SELECT 1 FROM workers w WHERE w.id = e.created_by AND w.dead_at IS NULL)
                             AS creator_alive, t.cancel_requested AS cancelling
                      FROM turns t JOIN executions e ON e.turn_id = t.id AND e.tool_step = t.tool_step
                     WHERE t.id = $1 AND e.status IN {OPEN_SQL}
                     ORDER BY e.call_id""",
                t["id"],
            )
            if not any(r["turn_id"] == t["id"] for r in rows):
                rows.append({"turn_id": t["id"], "id": None})  # nothing open: only a look later
        return [{**dict(r), "now": as_time(r["now"])} if r["id"] is not None else r for r in rows]

    async def look_later(self, conn: Any, looks: Mapping[str, float]) -> None:
        """When the scan looks at waiting turns next: seconds from now, by turn id (one
        statement where the backend can)."""
        for turn_id, seconds in looks.items():
            await conn.execute(
                "UPDATE turns SET wake_at = ts_add(now(), $2) WHERE id = $1 AND status = 'waiting'",
                turn_id,
                seconds,
            )

    async def mark_nudged(self, conn: Any, execution_id: str) -> None:
        """Record that a command was re-sent or a replay asked for (or that nobody serves its
        route): the next nudge waits longer, and an answer (any event) resets the count."""
        await conn.execute(
            """UPDATE executions SET replay_requested_at = now(), nudges = nudges + 1,
                      stall_backoff = CASE WHEN stall_backoff >= 32 THEN 64 ELSE stall_backoff * 2 END
                WHERE id = $1""",
            execution_id,
        )

    async def gaps_to_replay(self, conn: Any, gap_seconds: float) -> list[Any]:
        """Executions whose held events have waited longer than ``gap_seconds`` for a missing seq."""
        return list(
            await conn.fetch(
                f"""SELECT e.id, e.turn_id, e.status, e.last_seq, e.route, e.request_digest, e.nudges,
                           t.namespace, t.session_id
                      FROM executions e JOIN turns t ON t.id = e.turn_id
                     WHERE e.holding AND e.status IN ('intended', 'accepted', 'running', 'unknown')
                       AND EXISTS (SELECT 1 FROM held_events h WHERE h.execution_id = e.id
                                     AND h.received_at < ts_add(now(), $1))
                       AND (e.replay_requested_at IS NULL
                            OR e.replay_requested_at
                               < ts_add(now(), CAST($2 AS double precision) * e.stall_backoff))
                       {self.FOR_UPDATE}""",
                -gap_seconds,
                -4 * gap_seconds,
            )
        )

    async def wake_due(self, conn: Any, wake_channel: str) -> int:
        """Turns waiting for tool bindings whose deadline came: claimable again, so that their
        run says why they cannot go on."""
        woken = await conn.fetch(
            """UPDATE turns SET status = 'running', updated_at = now()
                WHERE status = 'waiting' AND phase = 'prepare' AND wake_at <= now() RETURNING id"""
        )
        if woken:
            await conn.execute("SELECT pg_notify($1, '')", wake_channel)
        return len(woken)

    async def wake_stuck(self, conn: Any, wake_channel: str) -> int:
        """Repair lost hints: waiting turns whose current step has nothing left to wait for."""
        woken = await conn.fetch(
            f"""UPDATE turns AS t SET status = 'running', wake_at = now(), waiting_for = NULL,
                       updated_at = now(), revision = revision + 1
                 WHERE status = 'waiting' AND phase = 'wait_tools' AND wake_at <= now()
                   AND EXISTS (SELECT 1 FROM executions e
                                WHERE e.turn_id = t.id AND e.tool_step = t.tool_step)
                   AND {SETTLED}
             RETURNING id"""
        )
        if woken:
            await conn.execute("SELECT pg_notify($1, '')", wake_channel)
        return len(woken)

    # ---- failing a turn, and the cancels it sends --------------------------------------

    async def fail_turn(
        self,
        conn: Any,
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
            f"""UPDATE turns SET status = 'failed', error = $2, lease_owner = NULL, lease_expires_at = NULL,
                       waiting_for = NULL, lease_epoch = lease_epoch + 1, revision = revision + 1,
                       updated_at = now()
                 WHERE id = $1 AND status NOT IN {TERMINAL_SQL} AND ({fence})
             RETURNING session_id, thread_id, namespace, phase, created_at""",
            turn_id,
            error,
            *owned,
        )
        if row is None:
            return None
        controls, cancelled = await self._settle_open(
            conn, turn_id, row["namespace"], row["session_id"], error, topology
        )
        written = [*preface, facts.failed(error)] + [facts.cancelled(*one) for one in cancelled]
        written += await self.reject_received(conn, turn_id, "the turn failed first")
        await self.append(
            conn, row["session_id"], turn_id, written, thread_id=row["thread_id"], status="failed",
            phase=row["phase"],
        )  # fmt: skip
        if wake_channel is not None:
            await conn.execute("SELECT pg_notify($1, '')", wake_channel)
        return Settled(turn_id, controls, as_time(row["created_at"]))

    async def reject_received(self, conn: Any, turn_id: str, reason: str) -> list[dict[str, Any]]:
        """Reject the controls of a turn that ended before they could be applied; their facts."""
        rows = await conn.fetch(
            """UPDATE controls SET status = 'rejected', reason = $2, decided_at = now()
                WHERE turn_id = $1 AND status = 'received' RETURNING id, kind""",
            turn_id,
            reason,
        )
        if rows:
            await conn.execute("UPDATE turns SET pending = 0 WHERE id = $1", turn_id)
        return [
            facts.control(r["id"], r["kind"], "rejected", reason) for r in sorted(rows, key=lambda r: r["id"])
        ]

    async def _settle_open(
        self,
        conn: Any,
        turn_id: str,
        namespace: str,
        session_id: str,
        error: dict[str, str],
        topology: Topology,
    ) -> tuple[list[Control], list[tuple[str, str, str, str]]]:
        """Settle the unfinished executions of a turn that ended before them.

        Each becomes CANCELLED here, with the turn's error, and its Hands are told: a cancel
        control goes out through the outbox in this same transaction. A command they have not
        seen yet then never runs (the cancel leaves a tombstone), a body that runs is asked to
        stop, and whatever they report afterwards is a late event the Brain leaves alone.
        UNKNOWN executions stay UNKNOWN: a reconcile may still come.
        """
        reason = f"its turn ended first ({error.get('code')}: {error.get('message')})"
        rows = await conn.fetch(
            f"""UPDATE executions SET status = 'cancelled', error = $2, holding = false, command = NULL,
                       updated_at = now()
                 WHERE turn_id = $1 AND status IN {UNSETTLED_SQL}
             RETURNING id, route, request_digest, call_id, tool""",
            turn_id,
            {"code": "cancelled", "message": reason},
        )
        controls: list[Control] = []
        cancelled: list[tuple[str, str, str, str]] = []  # execution, call, tool, reason
        for e in sorted(rows, key=lambda r: r["id"]):
            control = CancelControl(
                execution_id=e["id"],
                namespace=namespace,
                session_id=session_id,
                request_digest=e["request_digest"],
                body=CancelBody(reason=reason),
            )
            controls.append(await self.add_control(conn, topology.controls(e["route"]), control))
            cancelled.append((e["id"], e["call_id"], e["tool"], reason))
            await conn.execute("DELETE FROM held_events WHERE execution_id = $1", e["id"])
        return controls, cancelled

    async def add_control(self, conn: Any, queue: str, control: Any) -> Control:
        payload = encode(control)
        outbox_id = await conn.fetchval(
            "INSERT INTO outbox (queue, message_id, payload) VALUES ($1, $2, $3) RETURNING id",
            queue,
            control.message_id,
            payload,
        )
        return Control(queue, control.message_id, payload, outbox_id)

    async def unpublished_controls(self, conn: Any, limit: int = 200) -> list[Control]:
        rows = await conn.fetch(
            "SELECT id, queue, message_id, payload FROM outbox WHERE published_at IS NULL"
            " ORDER BY id LIMIT $1",
            limit,
        )
        return [Control(r["queue"], r["message_id"], bytes(r["payload"]), r["id"]) for r in rows]

    async def controls_published(self, conn: Any, ids: Collection[int]) -> None:
        for outbox_id in ids:
            await conn.execute("UPDATE outbox SET published_at = now() WHERE id = $1", outbox_id)
