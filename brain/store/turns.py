"""Turn rows: submit, claim under a lease with an epoch, and fenced phase commits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn

import asyncpg

from brain.agents import AgentDefinition
from brain.states import (
    PHASE_TRANSITIONS,
    TURN_TRANSITIONS,
    TurnPhase,
    TurnStatus,
    phase_transition,
    sources,
    turn_transition,
)
from brain.store import events
from infra.db import dialect
from protocol import ConflictError, NotFoundError, StaleOwnerError, digest, new_id


@dataclass(frozen=True)
class Lease:
    """Ownership of one turn by one run; every commit is checked against the epoch."""

    turn_id: str
    owner: str
    epoch: int
    run_id: int


class Claim(NamedTuple):
    """A claimed turn: its lease, its row, and whether another turn was claimable too.

    ``more`` tells the driver whether to pass a wake hint on and claim again after this
    run; it reads the claim's own snapshot, so a turn another claim is taking right now may
    count (one needless look), and a turn made claimable later brings its own wake hint.
    """

    lease: Lease
    row: asyncpg.Record
    more: bool


async def submit(
    conn: asyncpg.Connection,
    *,
    namespace: str,
    session_id: str,
    request_id: str,
    user_input: str,
    agent: AgentDefinition,
) -> tuple[str, bool]:
    """Accept a turn (inside the caller's transaction). Returns (turn id, created now).

    The same request id with the same input returns the original turn; with a different
    input it is a conflict. A new session gets a main thread pinned to this agent version.
    """
    input_doc = {"text": user_input}
    input_digest = digest(input_doc)
    # One read for the three things a submit checks: the request id, the agent, the session.
    known = await conn.fetchrow(
        """SELECT t.id AS turn_id, t.input_digest, a.digest AS agent_digest, s.namespace AS session_ns
             FROM (SELECT 1 AS one) AS here
             LEFT JOIN turns t ON t.namespace = $1 AND t.session_id = $2 AND t.request_id = $3
             LEFT JOIN agents a ON a.name = $4 AND a.version = $5
             LEFT JOIN sessions s ON s.id = $2""",
        namespace,
        session_id,
        request_id,
        agent.name,
        agent.version,
    )
    if known["turn_id"] is not None:
        if known["input_digest"] != input_digest:
            raise ConflictError(
                f"request id {request_id!r} in session {session_id!r} was already used "
                f"for a different input (turn {known['turn_id']})"
            )
        return known["turn_id"], False
    if known["agent_digest"] is None:
        await conn.execute(
            "INSERT INTO agents (name, version, digest, definition) VALUES ($1, $2, $3, $4)"
            " ON CONFLICT DO NOTHING",
            agent.name,
            agent.version,
            agent.digest,
            agent.model_dump(mode="json"),
        )
    elif known["agent_digest"] != agent.digest:
        raise ConflictError(
            f"agent {agent.name} version {agent.version} is already registered with different "
            "content; give the changed definition a new version"
        )
    new_session = known["session_ns"] is None
    if not new_session and known["session_ns"] != namespace:
        raise ConflictError(f"session {session_id!r} belongs to another namespace")

    turn_id = f"turn-{new_id()}"
    turn = [
        turn_id,
        namespace,
        session_id,
        request_id,
        input_digest,
        input_doc,
        TurnStatus.QUEUED,
        TurnPhase.PREPARE,
    ]
    accepted = {"request_id": request_id}
    if dialect(conn) == "postgres":
        # A new session, its main thread, the turn and its first event; or, in a known
        # session, the turn and its next event: one statement either way.
        if new_session:
            sql = f"""WITH session AS (
                          INSERT INTO sessions (id, namespace, last_event_seq) VALUES ($3, $2, 1)),
                      thread AS (
                          INSERT INTO threads (id, session_id, agent_name, agent_version)
                          VALUES ($3, $3, $10, $11)),
                      turn AS ({_INSERT_TURN}),
                      event AS (
                          INSERT INTO public_events (session_id, seq, turn_id, kind, data)
                          VALUES ($3, 1, $1, 'turn.accepted', $9))
                      SELECT 1"""
            await conn.execute(sql, *turn, accepted, agent.name, agent.version)
        else:
            public = events.cte("$3::text", "$1::text", "'turn.accepted'", "$9::jsonb")
            await conn.execute(f"WITH turn AS ({_INSERT_TURN}), {public} SELECT 1", *turn, accepted)
        return turn_id, True
    if new_session:
        await conn.execute("INSERT INTO sessions (id, namespace) VALUES ($1, $2)", session_id, namespace)
        await conn.execute(
            "INSERT INTO threads (id, session_id, agent_name, agent_version) VALUES ($1, $1, $2, $3)",
            session_id,
            agent.name,
            agent.version,
        )
    await conn.execute(_INSERT_TURN, *turn)
    await events.append(conn, session_id, turn_id, "turn.accepted", accepted)
    return turn_id, True


_INSERT_TURN = """INSERT INTO turns (id, namespace, session_id, thread_id, request_id, input_digest, input,
                                     status, phase)
                  VALUES ($1, $2, $3, $3, $4, $5, $6, $7, $8)"""


def _claimable_sql(alive: str, postgres: bool = True) -> str:
    """Turns that may be claimed now: due, not owned by a live lease, first in their thread.

    The dead owners are one array, computed once per statement, not a join or a subquery on
    ``t``: a claim that finds its candidate changed since its snapshot (another claim
    committed just now) has PostgreSQL recheck these conditions on the new row version, and
    only plain conditions on ``t`` were seen to hold up there. With a joined ``workers`` row
    the recheck kept the old version's (none: "dead"), and with a correlated subquery it let
    a few claims through as well: either way a claim took a turn from a live owner, which
    fencing then caught at the owner's next commit (tests/test_brain_store.py). SQLite has
    one writer at a time, so no claim there meets a row changed under it.
    """
    dead = f"SELECT w.id FROM workers w WHERE NOT {alive}"
    dead_owner = f"t.lease_owner = ANY (ARRAY({dead}))" if postgres else f"t.lease_owner IN ({dead})"
    return f"""
        SELECT t.id FROM turns t
        WHERE t.status IN ('queued', 'running') AND t.wake_at <= now()
          AND (t.lease_owner IS NULL OR t.lease_expires_at < now() OR {dead_owner})
          AND NOT EXISTS (
              SELECT 1 FROM turns p WHERE p.thread_id = t.thread_id AND p.seq < t.seq
                AND p.status NOT IN ('completed', 'failed', 'cancelled'))"""


async def anything_claimable(conn: asyncpg.Connection, alive_sql: str) -> bool:
    """A cheap look before opening a claim transaction (wake-ups reach every idle driver)."""
    claimable = _claimable_sql(alive_sql, dialect(conn) == "postgres")
    return bool(await conn.fetchval(f"SELECT EXISTS ({claimable})"))


def claim_sql(alive: str, postgres: bool = True) -> str:
    """Claim the first claimable turn (see ``_claimable_sql``) for a new run."""
    return f"""
    WITH candidate AS ({_claimable_sql(alive, postgres)}
        ORDER BY t.wake_at, t.seq
        LIMIT 1
        FOR UPDATE OF t SKIP LOCKED)
    UPDATE turns AS t
       SET lease_owner = $1, lease_epoch = t.lease_epoch + 1,
           lease_expires_at = now() + make_interval(secs => $2), status = 'running',
           updated_at = now()
      FROM candidate WHERE t.id = candidate.id
    RETURNING t.*"""


def _claim_pg_sql(alive: str) -> str:
    """The claim, its runs row and its ``turn.run_started`` event in one statement (PostgreSQL)."""
    event = events.cte(
        "(SELECT session_id FROM claimed)",
        "(SELECT id FROM claimed)",
        "'turn.run_started'",
        "jsonb_build_object('run_id', run.id, 'phase', c.phase, 'epoch', c.lease_epoch)",
        source=", claimed c, run",
    )
    # The statement's snapshot predates its own claim, so the claimed turn is one of the two.
    return f"""
    WITH claimed AS ({claim_sql(alive)}),
    run AS (
        INSERT INTO runs (turn_id, owner, epoch, started_phase)
        SELECT id, $1, lease_epoch, phase FROM claimed RETURNING id),
    {event}
    SELECT claimed.*, run.id AS run_id,
           (SELECT count(*) FROM ({_claimable_sql(alive)} LIMIT 2) AS two) > 1 AS more_claimable
      FROM claimed, run"""


async def claim(conn: asyncpg.Connection, owner: str, lease_seconds: float, alive_sql: str) -> Claim | None:
    """Claim one turn for a new run (inside the caller's transaction)."""
    if dialect(conn) == "postgres":
        row = await conn.fetchrow(_claim_pg_sql(alive_sql), owner, lease_seconds)
        if row is None:
            return None
        return Claim(Lease(row["id"], owner, row["lease_epoch"], row["run_id"]), row, row["more_claimable"])
    row = await conn.fetchrow(claim_sql(alive_sql, postgres=False), owner, lease_seconds)
    if row is None:
        return None
    more = await conn.fetchval(f"SELECT EXISTS ({_claimable_sql(alive_sql, postgres=False)})")
    run_id = await conn.fetchval(
        "INSERT INTO runs (turn_id, owner, epoch, started_phase) VALUES ($1, $2, $3, $4) RETURNING id",
        row["id"],
        owner,
        row["lease_epoch"],
        row["phase"],
    )
    await events.append(
        conn,
        row["session_id"],
        row["id"],
        "turn.run_started",
        {"run_id": run_id, "phase": row["phase"], "epoch": row["lease_epoch"]},
    )
    return Claim(Lease(row["id"], owner, row["lease_epoch"], run_id), row, bool(more))


async def load(conn: asyncpg.Connection, turn_id: str) -> asyncpg.Record:
    row = await conn.fetchrow("SELECT * FROM turns WHERE id = $1", turn_id)
    if row is None:
        raise NotFoundError(f"no turn {turn_id!r}")
    return row


async def advance(
    conn: asyncpg.Connection,
    lease: Lease,
    *,
    phase: TurnPhase | None = None,
    status: TurnStatus | None = None,
    release: bool = False,
    lease_seconds: float = 30.0,
    detail: dict[str, Any] | None = None,
    via: Sequence[TurnPhase] = (),
    **fields: Any,
) -> asyncpg.Record:
    """Move a turn inside the caller's transaction, fenced by the lease epoch.

    ``via``: phases the turn passes through on its way to ``phase`` in this same move (each
    step checked against the table and journaled), for phases that have nothing to write of
    their own: one UPDATE instead of one per phase.

    Raises ``StaleOwnerError`` (rolling the whole transaction back) when another run owns
    the turn now, and ``IllegalTransitionError`` for a move the tables forbid.
    """
    # One guarded UPDATE: fenced by owner and epoch, and allowed only from the states the
    # transition tables permit. Only when it matches nothing is the row read, to say why.
    sets: dict[str, Any] = dict(fields)
    guards = ["lease_owner = $2", "lease_epoch = $3"]
    args: list[Any] = [lease.turn_id, lease.owner, lease.epoch]
    path = [*via, phase] if phase is not None else []
    for a, b in zip(path, path[1:], strict=False):
        phase_transition(a, b)
    if phase is not None:
        sets["phase"] = phase
        args.append(sources(PHASE_TRANSITIONS, path[0]))
        guards.append(f"phase = ANY(${len(args)}::text[])")
    if status is not None:
        sets["status"] = status
        args.append([*sources(TURN_TRANSITIONS, status), str(status)])  # or staying there
        guards.append(f"status = ANY(${len(args)}::text[])")
    if release:
        sets["lease_owner"] = None
        sets["lease_expires_at"] = None
    columns = list(sets)
    assignments = "".join(f"{c} = ${len(args) + i + 1}, " for i, c in enumerate(columns))
    extend = "" if release else f", lease_expires_at = now() + make_interval(secs => {float(lease_seconds)})"
    update = (
        f"UPDATE turns SET {assignments}revision = revision + 1, updated_at = now(){extend}"
        f" WHERE id = $1 AND {' AND '.join(guards)} RETURNING *"
    )
    values = [*args, *[sets[c] for c in columns]]
    passed = [str(p) for p in via]  # journaled with no detail; the last step gets ``detail``
    if dialect(conn) == "postgres":  # the step journal rows in the same round trip
        n = len(values)
        row = await conn.fetchrow(
            f"""WITH moved AS ({update}),
                step AS (
                    INSERT INTO steps (turn_id, run_id, phase, detail)
                    SELECT id, ${n + 1}::bigint, p.phase,
                           CASE WHEN p.last THEN ${n + 2}::jsonb ELSE '{{}}' END
                      FROM moved, (SELECT unnest(${n + 3}::text[]) AS phase, false AS last
                                   UNION ALL SELECT moved.phase, true FROM moved) AS p)
                SELECT * FROM moved""",
            *values,
            lease.run_id,
            detail or {},
            passed,
        )
    else:
        row = await conn.fetchrow(update, *values)
        if row is not None:
            for step_phase, step_detail in [*((p, {}) for p in passed), (row["phase"], detail or {})]:
                await conn.execute(
                    "INSERT INTO steps (turn_id, run_id, phase, detail) VALUES ($1, $2, $3, $4)",
                    lease.turn_id,
                    lease.run_id,
                    step_phase,
                    step_detail,
                )
    if row is None:
        await _refuse(conn, lease, path[0] if path else None, status)
    return row


async def _refuse(
    conn: asyncpg.Connection, lease: Lease, phase: TurnPhase | None, status: TurnStatus | None
) -> NoReturn:
    """Raise why a guarded move of the turn matched nothing."""
    current = await conn.fetchrow(
        "SELECT status, phase, lease_owner, lease_epoch FROM turns WHERE id = $1", lease.turn_id
    )
    if current is not None and (current["lease_owner"], current["lease_epoch"]) == (lease.owner, lease.epoch):
        if phase is not None:
            phase_transition(TurnPhase(current["phase"]), phase)
        if status is not None and status != current["status"]:
            turn_transition(TurnStatus(current["status"]), status)
    raise StaleOwnerError(f"turn {lease.turn_id}: run epoch {lease.epoch} of {lease.owner} no longer owns it")


async def append_history(
    conn: asyncpg.Connection, thread_id: str, turn_id: str, role: str, content: dict[str, Any]
) -> None:
    await conn.execute(
        """INSERT INTO history (thread_id, position, turn_id, role, content)
           SELECT $1, coalesce(max(position), 0) + 1, $2, $3, $4 FROM history WHERE thread_id = $1""",
        thread_id,
        turn_id,
        role,
        content,
    )


async def record_reply(
    conn: asyncpg.Connection,
    lease: Lease,
    *,
    thread_id: str,
    session_id: str,
    reply: dict[str, Any],
    usage: dict[str, Any],
    content: dict[str, Any],
    tool_calls: int,
) -> None:
    """A model reply: its ``model_calls`` row, its history entry and its ``turn.model_replied``
    event (one statement on PostgreSQL)."""
    detail = {"tool_calls": tool_calls}
    if dialect(conn) != "postgres":
        await conn.execute(
            "INSERT INTO model_calls (turn_id, run_id, reply, usage) VALUES ($1, $2, $3, $4)",
            lease.turn_id,
            lease.run_id,
            reply,
            usage,
        )
        await append_history(conn, thread_id, lease.turn_id, "assistant", content)
        await events.append(conn, session_id, lease.turn_id, "turn.model_replied", detail)
        return
    public = events.cte("$7::text", "$1::text", "'turn.model_replied'", "$8::jsonb")
    await conn.execute(
        f"""WITH call AS (
                INSERT INTO model_calls (turn_id, run_id, reply, usage) VALUES ($1, $2, $3, $4)),
            entry AS (
                INSERT INTO history (thread_id, position, turn_id, role, content)
                SELECT $5, coalesce(max(position), 0) + 1, $1, 'assistant', $6
                  FROM history WHERE thread_id = $5),
            {public}
            SELECT 1""",
        lease.turn_id,
        lease.run_id,
        reply,
        usage,
        thread_id,
        content,
        session_id,
        detail,
    )


async def history(conn: asyncpg.Connection, thread_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT position, turn_id, role, content FROM history WHERE thread_id = $1 ORDER BY position",
        thread_id,
    )
