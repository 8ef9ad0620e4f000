"""Tool executions on the Brain side: intents, and applying sequenced events from Hands."""

from __future__ import annotations

from typing import Any

import asyncpg

from brain.sequencing import Arrival, classify, drainable
from brain.states import (
    EVENT_STATUS,
    EXECUTION_TRANSITIONS,
    TERMINAL_EXECUTION,
    ExecutionStatus,
    execution_transition,
    sources,
)
from brain.store import events, outbox
from infra.db import Json, dialect
from infra.logging import get_logger
from protocol import ConflictError, NotFoundError, RoutingError, decode, encode

log = get_logger(__name__)

_INSERT_INTENT = """INSERT INTO executions (id, turn_id, tool_step, call_id, route, tool, binding_digest,
                                   replay_policy, args, request_digest, status, command_message_id)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"""


async def insert_intent(
    conn: asyncpg.Connection,
    *,
    execution_id: str,
    turn_id: str,
    tool_step: int,
    call_id: str,
    binding: dict[str, Any],
    args: dict[str, Any],
    request_digest: str,
    command_message_id: str | None = None,
    command: tuple[str, bytes] | None = None,
    session_id: str | None = None,
) -> None:
    """An INTENDED execution row; with ``command`` (queue, payload) and ``session_id`` also its
    outbox command and its ``execution.intended`` public event, together (invariant 3): one
    statement on PostgreSQL."""
    values = [
        execution_id,
        turn_id,
        tool_step,
        call_id,
        binding["route"],
        binding["name"],
        binding["digest"],
        binding["replay_policy"],
        args,
        request_digest,
        ExecutionStatus.INTENDED,
        command_message_id,
    ]
    if command is None:
        await conn.execute(_INSERT_INTENT, *values)
        return
    assert session_id is not None and command_message_id is not None
    queue, payload = command
    detail = {"execution_id": execution_id, "call_id": call_id, "tool": binding["name"]}
    if dialect(conn) != "postgres":
        await conn.execute(_INSERT_INTENT, *values)
        await outbox.add(conn, queue, command_message_id, payload)
        await events.append(conn, session_id, turn_id, "execution.intended", detail)
        return
    public = events.cte("$15::text", "$2::text", "'execution.intended'", "$16::jsonb")
    await conn.execute(
        f"""WITH intent AS ({_INSERT_INTENT}),
            command AS (INSERT INTO outbox (queue, message_id, payload) VALUES ($13, $12, $14)),
            {public}
            SELECT 1""",
        *values,
        queue,
        payload,
        session_id,
        detail,
    )


async def for_step(conn: asyncpg.Connection, turn_id: str, tool_step: int) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT * FROM executions WHERE turn_id = $1 AND tool_step = $2 ORDER BY call_id",
        turn_id,
        tool_step,
    )


def all_terminal(rows: list[asyncpg.Record]) -> bool:
    return bool(rows) and all(ExecutionStatus(r["status"]) in TERMINAL_EXECUTION for r in rows)


async def receive(conn: asyncpg.Connection, event: Any, wake_channel: str) -> Arrival:
    """Apply one verified event inside the caller's transaction, as a contiguous prefix.

    Duplicates are no-ops, an event ahead of a gap is held durably (so the message can be
    acked) and applied once the gap is filled. Returns what happened to this event.
    """
    if dialect(conn) == "postgres" and event.kind in _IN_PLACE_KINDS:
        applied = await _apply_in_place(conn, event)
        if applied is not None:
            if EVENT_STATUS[event.kind] in TERMINAL_EXECUTION:
                await _wake_turn_if_step_done(conn, applied["turn_id"], applied["tool_step"], wake_channel)
            return Arrival.APPLY
    row = await conn.fetchrow(
        """SELECT e.*, t.namespace, t.session_id, t.status AS turn_status
             FROM executions e JOIN turns t ON t.id = e.turn_id
            WHERE e.id = $1 FOR UPDATE OF e""",
        event.execution_id,
    )
    if row is None:
        raise NotFoundError(f"event for unknown execution {event.execution_id}")
    if (row["namespace"], row["session_id"]) != (event.namespace, event.session_id):
        raise RoutingError(
            f"event for execution {event.execution_id} claims scope {event.scope}, "
            f"but it belongs to {row['namespace']}/{row['session_id']}"
        )
    if row["request_digest"] != event.request_digest:
        raise ConflictError(f"event for execution {event.execution_id} carries a foreign request digest")

    arrival = classify(
        row["last_seq"], event.seq, settled=ExecutionStatus(row["status"]) in TERMINAL_EXECUTION
    )
    if arrival is Arrival.DUPLICATE:
        if row["nudges"] and event.seq == row["last_seq"]:
            # The answer to a nudge (it asks for the last event again): the Hands have the
            # execution, which has nothing new yet. Not a silence that counts towards giving up.
            await conn.execute("UPDATE executions SET nudges = 0 WHERE id = $1", row["id"])
        return arrival
    if arrival is Arrival.LATE:
        await _note_late(conn, row, event)
        return arrival
    if arrival is Arrival.HOLD:
        await conn.execute(
            "INSERT INTO held_events (execution_id, seq, payload) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
            event.execution_id,
            event.seq,
            encode(event),
        )
        await conn.execute("UPDATE executions SET holding = true WHERE id = $1", event.execution_id)
        return arrival

    # Held events that the new one makes contiguous are applied after it, in seq order, in
    # this same transaction.
    pending = [event]
    if row["holding"]:
        held = await conn.fetch(
            "SELECT seq, payload FROM held_events WHERE execution_id = $1 AND seq > $2 ORDER BY seq",
            event.execution_id,
            event.seq,
        )
        payloads = {r["seq"]: r["payload"] for r in held}
        ready = drainable(event.seq, list(payloads))
        pending += [decode(payloads[seq]) for seq in ready]
        await conn.execute(
            "DELETE FROM held_events WHERE execution_id = $1 AND seq <= $2",
            event.execution_id,
            ready[-1] if ready else event.seq,
        )
        await conn.execute(
            "UPDATE executions SET holding = EXISTS (SELECT 1 FROM held_events WHERE execution_id = $1)"
            " WHERE id = $1",
            event.execution_id,
        )
    status = ExecutionStatus(row["status"])
    for one in pending:
        status = await _apply(conn, row, status, one)
    if status in TERMINAL_EXECUTION:
        await _wake_turn_if_step_done(conn, row["turn_id"], row["tool_step"], wake_channel)
    return arrival


async def receive_alone(conn: asyncpg.Connection, event: Any) -> Arrival | None:
    """Apply the usual non-final event with no transaction around it (its in-place apply is
    one statement, atomic on its own); None when it is not that case, and nothing is written:
    then :func:`receive` it in a transaction. A final event also wakes its turn, so it always
    goes the transactional way."""
    if dialect(conn) != "postgres" or event.kind not in _IN_PLACE_KINDS:
        return None
    if EVENT_STATUS[event.kind] in TERMINAL_EXECUTION:
        return None
    return Arrival.APPLY if await _apply_in_place(conn, event) is not None else None


async def _note_late(conn: asyncpg.Connection, row: asyncpg.Record, event: Any) -> None:
    """What the Hands say of an execution after the Brain settled it (its turn ended first) does
    not change its status, but its outcome is kept beside it: a cancel is only a request, and an
    operator must see that the tool acted after all (or did not)."""
    log.warning("late_event", status=row["status"], kind=event.kind, seq=event.seq)
    if row["status"] != ExecutionStatus.CANCELLED:
        return  # nothing comes after a final event of the Hands' own: not theirs to change
    if event.kind not in ("succeeded", "failed", "cancelled", "unknown"):
        await conn.execute("UPDATE executions SET last_seq = $2 WHERE id = $1", row["id"], event.seq)
        return
    sets, detail = _effect(event)
    how = f" ({sets['how']})" if sets.get("how") else ""
    said = f"; afterwards its Hands reported it {event.kind}{how}"
    if event.kind == "failed":
        said += f": {event.body.error.get('message')}"
    earlier = (row["error"] or {}).get("message", "its turn ended first")
    sets["error"] = {"code": row["status"], "message": earlier + said}
    await _set(conn, row["id"], "last_seq = $2", event.seq, sets)
    detail = {
        "execution_id": row["id"],
        "call_id": row["call_id"],
        "tool": row["tool"],
        "reported": event.kind,
    } | detail
    await events.append(conn, row["session_id"], row["turn_id"], "execution.reported_late", detail)


async def _set(
    conn: asyncpg.Connection, execution_id: str, fixed: str, seq: int, sets: dict[str, Any]
) -> None:
    """``UPDATE executions SET <fixed>, <sets>`` of one execution; ``fixed`` may use ``$2`` (the
    event's seq)."""
    cols = list(sets)
    assigned = ", ".join(f"{c} = ${i + 3}" for i, c in enumerate(cols))
    await conn.execute(
        f"UPDATE executions SET {fixed}, {assigned} WHERE id = $1",
        execution_id,
        seq,
        *[sets[c] for c in cols],
    )


def _effect(event: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a status-changing event sets on the execution row (beyond status and seq), and
    what its public event says (beyond the execution's id, call id and tool)."""
    body = event.body
    sets: dict[str, Any] = {}
    detail: dict[str, Any] = {}
    if event.kind == "started":
        sets["attempts"] = body.attempt
        detail.update(attempt=body.attempt, reason=body.reason)
    elif event.kind == "succeeded":
        sets.update(
            result=Json(body.result),
            how=body.how,
            evidence=body.evidence,
            output_bytes=body.output_bytes,
            error=None,
        )
    elif event.kind == "failed":
        sets.update(error=body.error, how=body.how, evidence=body.evidence, output_bytes=body.output_bytes)
    elif event.kind == "unknown":
        sets["error"] = {"code": "unknown", "message": body.reason}
        detail["reason"] = body.reason
    if event.kind in ("succeeded", "failed"):
        detail["how"] = body.how
    return sets, detail


# Event kinds applied in place on PostgreSQL: a status change and nothing else (an output page
# has its own table, an UNKNOWN also tells the turn what it waits for).
_IN_PLACE_KINDS = frozenset({"accepted", "started", "succeeded", "failed", "cancelled"})
_PROGRESS = "last_seq = $2, updated_at = now(), replay_requested_at = NULL, stall_backoff = 1, nudges = 0"


async def _apply_in_place(conn: asyncpg.Connection, event: Any) -> asyncpg.Record | None:
    """The usual event in one statement: the next seq of an execution of the event's scope and
    digest, in a status the transition table lets it leave, with nothing held back. Applies it
    and its public event and returns the execution's turn and step; else None, and nothing is
    written (the full path then classifies it: duplicate, gap, refusal)."""
    new = EVENT_STATUS[event.kind]
    assert new is not None
    sets, detail = _effect(event)
    sets["status"] = new
    cols = list(sets)
    n = len(cols) + 3
    public = events.cte(
        "(SELECT session_id FROM moved)",
        "m.turn_id",
        f"${n + 4}::text",
        f"jsonb_build_object('execution_id', m.id, 'call_id', m.call_id, 'tool', m.tool) || ${n + 5}::jsonb",
        source=", moved m",
    )
    return await conn.fetchrow(
        f"""WITH moved AS (
                UPDATE executions e SET {_PROGRESS},
                       {", ".join(f"{c} = ${i + 3}" for i, c in enumerate(cols))}
                  FROM turns t
                 WHERE e.id = $1 AND t.id = e.turn_id AND e.last_seq = $2 - 1 AND NOT e.holding
                   AND e.status = ANY(${n}::text[]) AND e.request_digest = ${n + 1}
                   AND t.namespace = ${n + 2} AND t.session_id = ${n + 3}
                RETURNING e.id, e.turn_id, e.tool_step, e.call_id, e.tool, t.session_id),
            {public}
            SELECT turn_id, tool_step FROM moved""",
        event.execution_id,
        event.seq,
        *[sets[c] for c in cols],
        sources(EXECUTION_TRANSITIONS, new),
        event.request_digest,
        event.namespace,
        event.session_id,
        f"execution.{new}",
        detail,
    )


async def _apply(
    conn: asyncpg.Connection, row: asyncpg.Record, status: ExecutionStatus, event: Any
) -> ExecutionStatus:
    """Apply one contiguous event: its effect, ``last_seq`` and its public event."""
    if event.kind == "output_page":
        await conn.execute(
            "INSERT INTO execution_output (execution_id, byte_offset, data) VALUES ($1, $2, $3)"
            " ON CONFLICT DO NOTHING",
            row["id"],
            event.body.offset,
            event.body.data,
        )
        await conn.execute(f"UPDATE executions SET {_PROGRESS} WHERE id = $1", row["id"], event.seq)
        return status
    new = EVENT_STATUS[event.kind]
    assert new is not None
    new = execution_transition(status, new)
    sets, extra = _effect(event)
    sets["status"] = new
    await _set(conn, row["id"], _PROGRESS, event.seq, sets)
    if event.kind == "unknown":
        await conn.execute(
            "UPDATE turns SET waiting_for = $2 WHERE id = $1",
            row["turn_id"],
            f"reconcile of execution {row['id']} ({row['tool']} {row['call_id']}): {event.body.reason}",
        )
    detail = {"execution_id": row["id"], "call_id": row["call_id"], "tool": row["tool"]} | extra
    await events.append(conn, row["session_id"], row["turn_id"], f"execution.{new}", detail)
    return new


_TERMINAL_SQL = ", ".join(f"'{s.value}'" for s in sorted(TERMINAL_EXECUTION))
_WAKE_IF_STEP_DONE = f"""
    UPDATE turns SET status = 'running', wake_at = now(), waiting_for = NULL, updated_at = now()
     WHERE id = $1 AND status = 'waiting' AND tool_step = $2
       AND EXISTS (SELECT 1 FROM executions e WHERE e.turn_id = $1 AND e.tool_step = $2)
       AND NOT EXISTS (SELECT 1 FROM executions e WHERE e.turn_id = $1 AND e.tool_step = $2
                         AND e.status NOT IN ({_TERMINAL_SQL}))
    RETURNING id"""


async def _wake_turn_if_step_done(
    conn: asyncpg.Connection, turn_id: str, tool_step: int, wake_channel: str
) -> None:
    # Two sibling executions finishing at once must not both miss the other's result. They
    # are serialised before this point: applying a terminal event appended a public event,
    # which locked the turn's session row (events.append) until commit. So the second one
    # waits for the first to commit, and this statement (a new snapshot) sees its result.
    # A WAITING turn whose step moved on is not woken: its owning run re-checks under lock.
    if dialect(conn) == "postgres":
        await conn.execute(
            f"WITH woken AS ({_WAKE_IF_STEP_DONE}) SELECT pg_notify($3, '') FROM woken",
            turn_id,
            tool_step,
            wake_channel,
        )
    elif await conn.fetchval(_WAKE_IF_STEP_DONE, turn_id, tool_step) is not None:
        await events.wake(conn, wake_channel)


async def wake_stuck_turns(conn: asyncpg.Connection, wake_channel: str) -> int:
    """Repair lost hints: waiting turns whose current step has nothing left to wait for."""
    rows = await conn.fetch(
        """SELECT t.id, t.tool_step FROM turns t
            WHERE t.status = 'waiting' AND t.phase = 'wait_tools'
              AND NOT EXISTS (SELECT 1 FROM executions e WHERE e.turn_id = t.id
                                AND e.tool_step = t.tool_step
                                AND e.status NOT IN ('succeeded', 'failed', 'cancelled'))
            FOR UPDATE SKIP LOCKED"""
    )
    for r in rows:
        await _wake_turn_if_step_done(conn, r["id"], r["tool_step"], wake_channel)
    return len(rows)
