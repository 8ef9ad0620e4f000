"""Turn rows: submit, claim under a lease with an epoch, and fenced phase commits."""

from __future__ import annotations

from collections.abc import Collection, Sequence
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

    The same request id with the same input (and agent) returns the original turn; with a
    different input it is a conflict. A new session gets a main thread pinned to this agent
    version; a turn for another agent or version in that session is a conflict too.
    """
    input_doc = {"text": user_input}
    input_digest = digest(input_doc)
    # One read for what a submit checks: the request id, the agent, the session and its thread.
    known = await conn.fetchrow(
        """SELECT t.id AS turn_id, t.input_digest, a.digest AS agent_digest, s.namespace AS session_ns,
                  th.agent_name, th.agent_version
             FROM (SELECT 1 AS one) AS here
             LEFT JOIN turns t ON t.namespace = $1 AND t.session_id = $2 AND t.request_id = $3
             LEFT JOIN agents a ON a.name = $4 AND a.version = $5
             LEFT JOIN sessions s ON s.id = $2
             LEFT JOIN threads th ON th.id = $2""",
        namespace,
        session_id,
        request_id,
        agent.name,
        agent.version,
    )
    if known["turn_id"] is not None and known["input_digest"] != input_digest:
        raise ConflictError(
            f"request id {request_id!r} in session {session_id!r} was already used "
            f"for a different input (turn {known['turn_id']})"
        )
    pinned = (known["agent_name"], known["agent_version"])
    if known["session_ns"] == namespace and pinned != (agent.name, agent.version):
        raise ConflictError(
            f"session {session_id!r} is pinned to agent {pinned[0]} version {pinned[1]}, not "
            f"{agent.name} version {agent.version}: submit with that agent, or start another session"
        )
    if known["turn_id"] is not None:
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


# Claimable: queued or running, due, not under a live lease, first unfinished in its thread.
# A lease is live until it runs out; the owner renews it while its run goes on (see
# ``renew_leases``), and the judgement that presumes an owner dead hands its turns back at once
# (``release_owners``). So a claim reads nothing but the turn's own columns.
_CLAIMABLE = """
    SELECT t.id FROM turns t
    WHERE t.status IN ('queued', 'running') AND t.wake_at <= now()
      AND (t.lease_owner IS NULL OR t.lease_expires_at < now())
      AND NOT EXISTS (
          SELECT 1 FROM turns p WHERE p.thread_id = t.thread_id AND p.seq < t.seq
            AND p.status NOT IN ('completed', 'failed', 'cancelled'))"""

_CLAIM = f"""
    WITH candidate AS ({_CLAIMABLE}
        ORDER BY t.wake_at, t.seq
        LIMIT 1
        FOR UPDATE OF t SKIP LOCKED)
    UPDATE turns AS t
       SET lease_owner = $1, lease_epoch = t.lease_epoch + 1, runs = t.runs + 1,
           lease_expires_at = now() + make_interval(secs => $2), status = 'running',
           updated_at = now()
      FROM candidate WHERE t.id = candidate.id
    RETURNING t.*"""


def _claim_pg_sql() -> str:
    """The claim, its runs row and its ``turn.run_started`` event in one statement (PostgreSQL)."""
    event = events.cte(
        "(SELECT session_id FROM claimed)",
        "(SELECT id FROM claimed)",
        "'turn.run_started'",
        "jsonb_build_object('run_id', run.id, 'run', c.runs, 'phase', c.phase, 'epoch', c.lease_epoch)",
        source=", claimed c, run",
    )
    # The statement's snapshot predates its own claim, so the claimed turn is one of the two.
    return f"""
    WITH claimed AS ({_CLAIM}),
    run AS (
        INSERT INTO runs (turn_id, owner, epoch, started_phase)
        SELECT id, $1, lease_epoch, phase FROM claimed RETURNING id),
    {event}
    SELECT claimed.*, run.id AS run_id,
           (SELECT count(*) FROM ({_CLAIMABLE} LIMIT 2) AS two) > 1 AS more_claimable
      FROM claimed, run"""


_CLAIM_PG = _claim_pg_sql()


async def anything_claimable(conn: asyncpg.Connection) -> bool:
    """A cheap look before opening a claim transaction (wake-ups reach every idle driver)."""
    return bool(await conn.fetchval(f"SELECT EXISTS ({_CLAIMABLE})"))


async def claim(conn: asyncpg.Connection, owner: str, lease_seconds: float) -> Claim | None:
    """Claim one turn for a new run (inside the caller's transaction)."""
    if dialect(conn) == "postgres":
        row = await conn.fetchrow(_CLAIM_PG, owner, lease_seconds)
        if row is None:
            return None
        return Claim(Lease(row["id"], owner, row["lease_epoch"], row["run_id"]), row, row["more_claimable"])
    row = await conn.fetchrow(_CLAIM, owner, lease_seconds)
    if row is None:
        return None
    more = await conn.fetchval(f"SELECT EXISTS ({_CLAIMABLE})")
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
        {"run_id": run_id, "run": row["runs"], "phase": row["phase"], "epoch": row["lease_epoch"]},
    )
    return Claim(Lease(row["id"], owner, row["lease_epoch"], run_id), row, bool(more))


async def renew_leases(
    conn: asyncpg.Connection, owner: str, turn_ids: Collection[str], lease_seconds: float
) -> None:
    """Extend the leases ``owner`` holds on ``turn_ids`` (its runs in progress): a phase that
    takes longer than a lease (a slow model) is not taken over while its Brain is alive."""
    if turn_ids:
        await conn.execute(
            """UPDATE turns SET lease_expires_at = now() + make_interval(secs => $3)
                WHERE id = ANY($2::text[]) AND lease_owner = $1""",
            owner,
            list(turn_ids),
            lease_seconds,
        )


async def wake_for_bindings(conn: asyncpg.Connection, wake_channel: str) -> int:
    """Tools were announced: turns waiting for bindings look again (each checks its own)."""
    woken = await conn.fetch(
        """UPDATE turns SET status = 'running', wake_at = now(), waiting_for = NULL, updated_at = now()
            WHERE status = 'waiting' AND phase = 'prepare' RETURNING id"""
    )
    if woken:
        await events.wake(conn, wake_channel)
    return len(woken)


async def wake_due(conn: asyncpg.Connection, wake_channel: str) -> int:
    """Turns whose wait has a deadline that came (no pool announced their tools in time): claimable
    again, so that their run says why they cannot go on."""
    woken = await conn.fetch(
        """UPDATE turns SET status = 'running', updated_at = now()
            WHERE status = 'waiting' AND phase = 'prepare' AND wake_at <= now() RETURNING id"""
    )
    if woken:
        await events.wake(conn, wake_channel)
    return len(woken)


async def release_owners(conn: asyncpg.Connection, owners: list[str], wake_channel: str) -> int:
    """Hand back the turns of Brains presumed dead (or retiring): claimable at once, and their
    runs fenced out (they no longer own what they would commit). Returns how many."""
    released = await conn.fetch(
        """UPDATE turns SET lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
            WHERE lease_owner = ANY($1::text[]) AND status NOT IN ('completed', 'failed', 'cancelled')
        RETURNING id""",
        owners,
    )
    if released:
        await events.wake(conn, wake_channel)
    return len(released)


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
