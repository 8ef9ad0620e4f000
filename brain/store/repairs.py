"""Repairs and endings of executions on the Brain's side: what the repair scan nudges (and how
it counts), and how a turn that ends before its executions settles them."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import asyncpg

from brain.store import events, outbox
from infra.transport import Topology
from protocol import CancelBody, CancelControl, encode


async def gaps_to_replay(conn: asyncpg.Connection, gap_seconds: float) -> list[asyncpg.Record]:
    """Executions whose held events have waited longer than ``gap_seconds`` for a missing seq."""
    return await conn.fetch(
        """SELECT e.id, e.turn_id, e.status, e.last_seq, e.route, e.request_digest, e.nudges,
                  t.namespace, t.session_id
             FROM executions e JOIN turns t ON t.id = e.turn_id
            WHERE e.holding AND e.status IN ('intended', 'accepted', 'running', 'unknown')
              AND EXISTS (SELECT 1 FROM held_events h WHERE h.execution_id = e.id
                            AND h.received_at < now() - make_interval(secs => $1))
              AND (e.replay_requested_at IS NULL
                   OR e.replay_requested_at < now() - make_interval(secs => $1 * 4 * e.stall_backoff))
            FOR UPDATE OF e SKIP LOCKED""",
        gap_seconds,
    )


async def stalled(
    conn: asyncpg.Connection,
    stall_seconds: float,
    limit: int = 100,
    *,
    queued_routes: Collection[str] = (),
) -> list[asyncpg.Record]:
    """Unfinished executions with no progress for ``stall_seconds`` (lost command or last event).

    UNKNOWN is not a stall: it waits for a reconcile on purpose. After each nudge (see
    :func:`mark_nudged`) the next one waits twice as long, up to 64 times ``stall_seconds``:
    a command that is merely queued behind a busy pool is not re-sent every few seconds, which
    would swamp the queue with duplicates exactly when it is longest. At most ``limit`` per
    pass, so that one scan transaction never holds many rows locked for long.

    ``queued_routes``: routes whose command queue has messages waiting for a consumer. Their
    INTENDED executions are left out: their commands are most likely in that line, and a
    re-sent copy would only join it. They count again once the line is gone.
    """
    return await conn.fetch(
        """SELECT e.id, e.turn_id, e.status, e.last_seq, e.route, e.request_digest, e.command_message_id,
                  e.nudges, t.namespace, t.session_id
             FROM executions e JOIN turns t ON t.id = e.turn_id
            WHERE e.status IN ('intended', 'accepted', 'running')
              AND e.updated_at < now() - make_interval(secs => $1)
              AND (e.replay_requested_at IS NULL
                   OR e.replay_requested_at < now() - make_interval(secs => $1 * e.stall_backoff))
              AND NOT (e.status = 'intended' AND e.route = ANY($3::text[]))
            LIMIT $2
            FOR UPDATE OF e SKIP LOCKED""",
        stall_seconds,
        limit,
        list(queued_routes),
    )


async def mark_nudged(conn: asyncpg.Connection, execution_id: str) -> None:
    """Record that a command was re-sent or a replay asked for (or that nobody serves its
    route): the next nudge waits longer, and an answer (any event) resets the count."""
    await conn.execute(
        "UPDATE executions SET replay_requested_at = now(), stall_backoff = LEAST(stall_backoff * 2, 64),"
        " nudges = nudges + 1 WHERE id = $1",
        execution_id,
    )


async def named_by(conn: asyncpg.Connection, header: Any) -> asyncpg.Record | None:
    """The execution an envelope names (its ``turn_id``, ``last_seq`` and ``turn_status``), if
    the envelope's scope and request digest are that execution's (else None: the message
    proves nothing about it)."""
    return await conn.fetchrow(
        """SELECT e.turn_id, e.last_seq, t.status AS turn_status
             FROM executions e JOIN turns t ON t.id = e.turn_id
            WHERE e.id = $1 AND t.namespace = $2 AND t.session_id = $3 AND e.request_digest = $4""",
        header.execution_id,
        header.namespace,
        header.session_id,
        header.request_digest,
    )


async def fail_turn(
    conn: asyncpg.Connection, turn_id: str, error: dict[str, str], wake_channel: str, topology: Topology
) -> int:
    """Fail a turn from outside its run (e.g. an update that cannot be verified, or Hands that
    no longer answer), and settle its executions (see :func:`settle_open`); returns how many.

    Bumping the epoch fences out whichever run still holds the lease.
    """
    row = await conn.fetchrow(
        """UPDATE turns SET status = 'failed', error = $2, lease_owner = NULL, waiting_for = NULL,
                  lease_epoch = lease_epoch + 1, updated_at = now()
            WHERE id = $1 AND status NOT IN ('completed', 'failed', 'cancelled')
        RETURNING session_id""",
        turn_id,
        error,
    )
    if row is None:
        return 0
    await events.append(conn, row["session_id"], turn_id, "turn.failed", {"error": error})
    settled = await settle_open(conn, turn_id, error, topology)
    await events.wake(conn, wake_channel)
    return settled


async def settle_open(
    conn: asyncpg.Connection, turn_id: str, error: dict[str, str], topology: Topology
) -> int:
    """Settle the unfinished executions of a turn that ended before them (it failed).

    Each becomes CANCELLED here, with the turn's error, and its Hands are told: a cancel
    control goes out through the outbox in this same transaction. A command they have not seen
    yet then never runs (the cancel leaves a tombstone), a body that runs is asked to stop, and
    whatever they report afterwards is a late event the Brain leaves alone. So nothing is
    nudged or waited for any more. UNKNOWN executions stay UNKNOWN: a reconcile may still come.
    Returns how many were settled.
    """
    turn = await conn.fetchrow("SELECT namespace, session_id FROM turns WHERE id = $1", turn_id)
    reason = f"its turn ended first ({error.get('code')}: {error.get('message')})"
    settled = await conn.fetch(
        """UPDATE executions SET status = 'cancelled', error = $2, holding = false, updated_at = now()
            WHERE turn_id = $1 AND status IN ('intended', 'accepted', 'running')
        RETURNING id, route, request_digest, call_id, tool""",
        turn_id,
        {"code": "cancelled", "message": reason},
    )
    for e in settled:
        control = CancelControl(
            execution_id=e["id"],
            namespace=turn["namespace"],
            session_id=turn["session_id"],
            request_digest=e["request_digest"],
            body=CancelBody(reason=reason),
        )
        await outbox.add(conn, topology.controls(e["route"]), control.message_id, encode(control))
        detail = {"execution_id": e["id"], "call_id": e["call_id"], "tool": e["tool"], "reason": reason}
        await events.append(conn, turn["session_id"], turn_id, "execution.cancelled", detail)
    if settled:
        await conn.execute(
            "DELETE FROM held_events WHERE execution_id = ANY($1::text[])", [e["id"] for e in settled]
        )
    return len(settled)
