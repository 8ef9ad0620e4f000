"""The Hands ledger: its migrations and the SQL that reads and changes it.

The same SQL runs on PostgreSQL (distributed) and SQLite (embedded, via infra.sqlite).

Every function takes the ``conn`` of a transaction its caller owns (see ``infra.db.transact``),
so one state change (status, output, events) commits together or not at all (invariant 2).

Tables (in the pool's own schema, ``settings.hands_schema``):

- ``workers`` / ``worker_lock_seq``: live processes, see ``infra.liveness``;
- ``executions``: one row per execution id: the command, status, owner, attempts, result;
- ``output_chunks``: the tool's output pages by byte offset;
- ``events``: the event outbox: packed envelope bytes by (execution, seq), unpublished
  while ``published_at`` is NULL;
- ``reconciliations``: the audit record of every UNKNOWN resolved by a person.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any

import asyncpg

from hands.states import OPEN_STATUSES, LedgerStatus, transition
from infra.db import Json, dialect
from infra.liveness import ALIVE_SQL
from infra.parked import MIGRATION as PARKED
from infra.payloads import PayloadCodec
from protocol import (
    AcceptedBody,
    AcceptedEvent,
    CancelledBody,
    CancelledEvent,
    ConflictError,
    FailedBody,
    FailedEvent,
    NotFoundError,
    OutputPageBody,
    OutputPageEvent,
    StaleOwnerError,
    StartedBody,
    StartedEvent,
    SucceededBody,
    SucceededEvent,
    UnknownBody,
    UnknownEvent,
)

_STATUSES = ", ".join(f"'{s.value}'" for s in LedgerStatus)

POSTGRES: list[tuple[int, str]] = [
    (
        1,
        f"""
        CREATE SEQUENCE worker_lock_seq;
        CREATE TABLE workers (
            id text PRIMARY KEY,
            kind text NOT NULL,
            lock_key int NOT NULL,
            started_at timestamptz NOT NULL DEFAULT now()
        );
        CREATE TABLE executions (
            execution_id text PRIMARY KEY,
            route text NOT NULL,
            request_digest text NOT NULL,
            namespace text NOT NULL,
            session_id text NOT NULL,
            turn_id text,
            call_id text,
            tool text,
            binding_digest text,
            replay_policy text CHECK (replay_policy IN ('safe', 'unsafe')),
            args jsonb,
            status text NOT NULL CHECK (status IN ({_STATUSES})),
            owner text NOT NULL,
            attempts int NOT NULL DEFAULT 0,
            last_seq int NOT NULL DEFAULT 0,
            result jsonb,
            error jsonb,
            output_bytes bigint NOT NULL DEFAULT 0,
            cancel_requested boolean NOT NULL DEFAULT false,
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now()
        );
        CREATE INDEX executions_open ON executions (route, updated_at)
            WHERE status IN ('accepted', 'running', 'querying');
        CREATE TABLE output_chunks (
            execution_id text NOT NULL REFERENCES executions ON DELETE CASCADE,
            byte_offset bigint NOT NULL CHECK (byte_offset >= 0),
            data text NOT NULL,
            PRIMARY KEY (execution_id, byte_offset)
        );
        CREATE TABLE events (
            execution_id text NOT NULL REFERENCES executions ON DELETE CASCADE,
            seq int NOT NULL CHECK (seq >= 1),
            kind text NOT NULL,
            payload bytea NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            -- when it (last) became due for publishing; a replay request resets it
            pending_since timestamptz NOT NULL DEFAULT now(),
            published_at timestamptz,
            PRIMARY KEY (execution_id, seq)
        );
        CREATE INDEX events_unpublished ON events (pending_since) WHERE published_at IS NULL;
        CREATE TABLE reconciliations (
            id bigserial PRIMARY KEY,
            execution_id text NOT NULL REFERENCES executions ON DELETE CASCADE,
            outcome text NOT NULL CHECK (outcome IN ('succeeded', 'failed')),
            result jsonb,
            error jsonb,
            evidence text NOT NULL CHECK (evidence <> ''),
            actor text NOT NULL,
            at timestamptz NOT NULL DEFAULT now()
        );
        """,
    ),
    (
        2,
        # Liveness by a lease renewed in time, beside the lock (infra.liveness).
        """
        ALTER TABLE workers ADD COLUMN lease_expires_at timestamptz,
            ADD COLUMN lock_lost_at timestamptz, ADD COLUMN dead_at timestamptz;
        """,
    ),
    (3, PARKED["postgres"]),
    (
        4,
        # Integrity by construction, checked by tests (see the Brain's migration 9): an event, a
        # page or an audit row is written with or after its execution row, which is never deleted.
        """
        ALTER TABLE events DROP CONSTRAINT IF EXISTS events_execution_id_fkey;
        ALTER TABLE output_chunks DROP CONSTRAINT IF EXISTS output_chunks_execution_id_fkey;
        ALTER TABLE reconciliations DROP CONSTRAINT IF EXISTS reconciliations_execution_id_fkey;
        """,
    ),
]


_NOW = "(strftime('%Y-%m-%dT%H:%M:%f', 'now'))"

SQLITE: list[tuple[int, str]] = [
    (
        1,
        f"""
        CREATE TABLE workers (
            id text PRIMARY KEY,
            kind text NOT NULL,
            lock_key int NOT NULL,
            started_at timestamptz TEXT NOT NULL DEFAULT {_NOW}
        );
        CREATE TABLE executions (
            execution_id text PRIMARY KEY,
            route text NOT NULL,
            request_digest text NOT NULL,
            namespace text NOT NULL,
            session_id text NOT NULL,
            turn_id text,
            call_id text,
            tool text,
            binding_digest text,
            replay_policy text CHECK (replay_policy IN ('safe', 'unsafe')),
            args jsonb TEXT,
            status text NOT NULL CHECK (status IN ({_STATUSES})),
            owner text NOT NULL,
            attempts int NOT NULL DEFAULT 0,
            last_seq int NOT NULL DEFAULT 0,
            result jsonb TEXT,
            error jsonb TEXT,
            output_bytes int NOT NULL DEFAULT 0,
            cancel_requested boolean NOT NULL DEFAULT false,
            created_at timestamptz TEXT NOT NULL DEFAULT {_NOW},
            updated_at timestamptz TEXT NOT NULL DEFAULT {_NOW}
        );
        CREATE INDEX executions_open ON executions (route, updated_at)
            WHERE status IN ('accepted', 'running', 'querying');
        CREATE TABLE output_chunks (
            execution_id text NOT NULL REFERENCES executions ON DELETE CASCADE,
            byte_offset int NOT NULL CHECK (byte_offset >= 0),
            data text NOT NULL,
            PRIMARY KEY (execution_id, byte_offset)
        );
        CREATE TABLE events (
            execution_id text NOT NULL REFERENCES executions ON DELETE CASCADE,
            seq int NOT NULL CHECK (seq >= 1),
            kind text NOT NULL,
            payload bytea BLOB NOT NULL,
            created_at timestamptz TEXT NOT NULL DEFAULT {_NOW},
            pending_since timestamptz TEXT NOT NULL DEFAULT {_NOW},
            published_at timestamptz TEXT,
            PRIMARY KEY (execution_id, seq)
        );
        CREATE INDEX events_unpublished ON events (pending_since) WHERE published_at IS NULL;
        CREATE TABLE reconciliations (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            execution_id text NOT NULL REFERENCES executions ON DELETE CASCADE,
            outcome text NOT NULL CHECK (outcome IN ('succeeded', 'failed')),
            result jsonb TEXT,
            error jsonb TEXT,
            evidence text NOT NULL CHECK (evidence <> ''),
            actor text NOT NULL,
            at timestamptz TEXT NOT NULL DEFAULT {_NOW}
        );
        """,
    ),
    (
        2,
        """
        ALTER TABLE workers ADD COLUMN lease_expires_at timestamptz TEXT;
        ALTER TABLE workers ADD COLUMN lock_lost_at timestamptz TEXT;
        ALTER TABLE workers ADD COLUMN dead_at timestamptz TEXT;
        """,
    ),
    (3, PARKED["sqlite"]),
]

MIGRATIONS: dict[str, list[tuple[int, str]]] = {"postgres": POSTGRES, "sqlite": SQLITE}


@dataclass(frozen=True)
class Execution:
    """One row of ``executions``."""

    execution_id: str
    route: str
    request_digest: str
    namespace: str
    session_id: str
    turn_id: str | None
    call_id: str | None
    tool: str | None
    binding_digest: str | None
    replay_policy: str | None
    args: dict[str, Any] | None
    status: LedgerStatus
    owner: str
    attempts: int
    last_seq: int
    result: Any
    error: dict[str, str] | None
    output_bytes: int
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_record(cls, rec: asyncpg.Record) -> Execution:
        data = {f.name: rec[f.name] for f in fields(cls)}
        data["status"] = LedgerStatus(data["status"])
        return cls(**data)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly view (for ``hands show``)."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["status"] = self.status.value
        out["created_at"] = self.created_at.isoformat()
        out["updated_at"] = self.updated_at.isoformat()
        return out


@dataclass(frozen=True)
class PendingEvent:
    """An event row waiting to be published."""

    execution_id: str
    seq: int
    payload: bytes
    pending_since: datetime

    @property
    def message_id(self) -> str:
        # Stable across republishing, so a broker-level dedup (if any) sees the same message.
        return f"{self.execution_id}:{self.seq}"


# ---- executions -------------------------------------------------------------------------


def _insert_sql(values: dict[str, Any]) -> tuple[str, list[Any]]:
    """The INSERT of a new execution row (nothing when the id is in the ledger) and its values."""
    values = {**values, "status": LedgerStatus(values.get("status", LedgerStatus.ACCEPTED)).value}
    columns = list(values)
    placeholders = ", ".join(f"${i}" for i in range(1, len(columns) + 1))
    sql = (
        f"INSERT INTO executions ({', '.join(columns)}) VALUES ({placeholders}) "
        "ON CONFLICT (execution_id) DO NOTHING RETURNING *"
    )
    return sql, list(values.values())


async def insert_execution(conn: asyncpg.Connection, **values: Any) -> Execution | None:
    """Insert a new execution row; None if the execution id is already in the ledger."""
    sql, args = _insert_sql(values)
    rec = await conn.fetchrow(sql, *args)
    return Execution.from_record(rec) if rec is not None else None


async def insert_with_event(
    conn: asyncpg.Connection, codec: PayloadCodec, values: dict[str, Any], first_event: Any
) -> Execution | None:
    """Insert a new execution row together with its first event (seq 1); None if the
    execution id is already in the ledger (then nothing is written).

    On PostgreSQL both rows are one statement; elsewhere an insert, then :func:`append_event`.
    """
    if dialect(conn) != "postgres":
        row = await insert_execution(conn, **values)
        if row is not None:
            seq = await append_event(conn, codec, row.execution_id, first_event)
            row = replace(row, last_seq=seq)
        return row
    kind, payload = await _pack_event(codec, values["execution_id"], values, 1, first_event)
    insert, args = _insert_sql({**values, "last_seq": 1})
    n = len(args)
    rec = await conn.fetchrow(
        f"""WITH ins AS ({insert}),
            ev AS (
                INSERT INTO events (execution_id, seq, kind, payload)
                SELECT execution_id, 1, ${n + 1}, ${n + 2} FROM ins)
            SELECT * FROM ins""",
        *args,
        kind,
        payload,
    )
    return Execution.from_record(rec) if rec is not None else None


async def get_execution(
    conn: asyncpg.Connection, execution_id: str, *, for_update: bool = False
) -> Execution | None:
    lock = " FOR UPDATE" if for_update else ""
    rec = await conn.fetchrow(f"SELECT * FROM executions WHERE execution_id = $1{lock}", execution_id)
    return Execution.from_record(rec) if rec is not None else None


async def lock_owned(conn: asyncpg.Connection, execution_id: str, owner: str) -> Execution:
    """Lock the row for this transaction and check that ``owner`` still owns it (fencing).

    Ownership only moves away from a worker that looked dead (see :func:`claim_orphan`); a
    worker that was merely cut off and comes back gets StaleOwnerError instead of a commit.
    """
    row = await get_execution(conn, execution_id, for_update=True)
    if row is None:
        raise NotFoundError(f"execution {execution_id} is not in the ledger")
    if row.owner != owner:
        raise StaleOwnerError(
            f"execution {execution_id} is owned by {row.owner} now, not {owner}; "
            "this worker's commit is refused"
        )
    return row


async def move(
    conn: asyncpg.Connection,
    row: Execution,
    new: LedgerStatus,
    *,
    reconcile: bool = False,
    **changes: Any,
) -> Execution:
    """Change a (locked) row's status through the transition table, plus other columns."""
    sets, values = _status_change(row, new, reconcile, changes)
    rec = await conn.fetchrow(
        f"UPDATE executions SET {sets}, updated_at = now() WHERE execution_id = $1 RETURNING *",
        row.execution_id,
        *values,
    )
    return Execution.from_record(rec)


def _status_change(
    row: Execution, new: LedgerStatus, reconcile: bool, changes: dict[str, Any]
) -> tuple[str, list[Any]]:
    """SET clause (parameters from $2) and values for a checked move of ``row`` to ``new``."""
    transition(row.status, new, reconcile=reconcile)
    changes = {**changes, "status": LedgerStatus(new).value}
    if "result" in changes:
        changes["result"] = Json(changes["result"])  # any JSON type, on either store
    sets = ", ".join(f"{name} = ${i}" for i, name in enumerate(changes, start=2))
    return sets, list(changes.values())


async def release(conn: asyncpg.Connection, execution_id: str, owner: str) -> bool:
    """Hand an open execution of ``owner`` to a name no live worker has (see Executor)."""
    result = await conn.execute(
        "UPDATE executions SET owner = $3, updated_at = now() "
        "WHERE execution_id = $1 AND owner = $2 AND status = ANY($4::text[])",
        execution_id,
        owner,
        f"released-by:{owner}",
        [s.value for s in OPEN_STATUSES],
    )
    return result.endswith(" 1")


async def request_cancel(conn: asyncpg.Connection, execution_id: str) -> Execution | None:
    rec = await conn.fetchrow(
        "UPDATE executions SET cancel_requested = true, updated_at = now() "
        "WHERE execution_id = $1 RETURNING *",
        execution_id,
    )
    return Execution.from_record(rec) if rec is not None else None


async def add_output(conn: asyncpg.Connection, execution_id: str, data: str) -> int:
    """Append one output page; returns its byte offset (the output length before it)."""
    size = len(data.encode("utf-8"))
    offset: int = await conn.fetchval(
        "UPDATE executions SET output_bytes = output_bytes + $2, updated_at = now() "
        "WHERE execution_id = $1 RETURNING output_bytes - $2",
        execution_id,
        size,
    )
    await conn.execute(
        "INSERT INTO output_chunks (execution_id, byte_offset, data) VALUES ($1, $2, $3)",
        execution_id,
        offset,
        data,
    )
    return offset


async def has_output(conn: asyncpg.Connection, execution_id: str, offset: int, data: str) -> bool:
    """Whether the page ``data`` is stored at ``offset`` (did an unclear commit land?)."""
    found = await conn.fetchval(
        "SELECT data = $3 FROM output_chunks WHERE execution_id = $1 AND byte_offset = $2",
        execution_id,
        offset,
        data,
    )
    return bool(found)


# ---- recovery ---------------------------------------------------------------------------


# An owner missing from ``workers`` counts as dead too: NOT EXISTS covers both. An owner
# presumed dead has its open rows handed to a released name already (``release_owners``).
_OWNER_DEAD = f"NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = e.owner AND {ALIVE_SQL})"


async def release_owners(conn: asyncpg.Connection, owners: list[str]) -> int:
    """Hand the open executions of workers presumed dead (or retiring) to released names no
    live worker has, in the transaction that records their death: from then on their late
    commits are refused (fenced by owner), and any worker's recovery scan takes them over by
    the replay rule. Returns how many."""
    status = await conn.execute(
        "UPDATE executions SET owner = 'released-by:' || owner, updated_at = now()"
        " WHERE owner = ANY($1::text[]) AND status = ANY($2::text[])",
        owners,
        [s.value for s in OPEN_STATUSES],
    )
    return int(status.split()[-1])


async def open_orphans(conn: asyncpg.Connection, route: str, me: str, limit: int) -> list[tuple[str, str]]:
    """(execution_id, owner) of open executions of ``route`` whose owner is dead, oldest first."""
    recs = await conn.fetch(
        f"""SELECT e.execution_id, e.owner FROM executions e
            WHERE e.route = $1 AND e.status = ANY($2::text[]) AND e.owner <> $3
              AND {_OWNER_DEAD}
            ORDER BY e.updated_at LIMIT $4""",
        route,
        [s.value for s in OPEN_STATUSES],
        me,
        limit,
    )
    return [(r["execution_id"], r["owner"]) for r in recs]


async def open_owned(
    conn: asyncpg.Connection, route: str, owner: str, skip: list[str], limit: int
) -> list[str]:
    """Open executions of ``route`` that ``owner`` holds, except those in ``skip``, oldest first.

    The owner's own scan uses it to find rows it holds but has no task for (see
    ``RecoveryScanner``); ``skip`` is the set it does have tasks for.
    """
    recs = await conn.fetch(
        """SELECT execution_id FROM executions
           WHERE route = $1 AND owner = $2 AND status = ANY($3::text[])
             AND NOT (execution_id = ANY($4::text[]))
           ORDER BY updated_at LIMIT $5""",
        route,
        owner,
        [s.value for s in OPEN_STATUSES],
        skip,
        limit,
    )
    return [r["execution_id"] for r in recs]


async def claim_orphan(
    conn: asyncpg.Connection, execution_id: str, dead_owner: str, me: str
) -> Execution | None:
    """Compare-and-set the owner from ``dead_owner`` to ``me``; None if someone else won."""
    rec = await conn.fetchrow(
        f"""WITH target AS (
                SELECT execution_id FROM executions
                WHERE execution_id = $1 AND owner = $2 AND status = ANY($4::text[])
                FOR UPDATE SKIP LOCKED)
            UPDATE executions AS e SET owner = $3, updated_at = now()
            FROM target
            WHERE e.execution_id = target.execution_id AND {_OWNER_DEAD}
            RETURNING e.*""",
        execution_id,
        dead_owner,
        me,
        [s.value for s in OPEN_STATUSES],
    )
    return Execution.from_record(rec) if rec is not None else None


# ---- events (the outbox) ----------------------------------------------------------------

_EVENT_CLASSES: dict[type, type] = {
    AcceptedBody: AcceptedEvent,
    StartedBody: StartedEvent,
    OutputPageBody: OutputPageEvent,
    SucceededBody: SucceededEvent,
    FailedBody: FailedEvent,
    CancelledBody: CancelledEvent,
    UnknownBody: UnknownEvent,
}


async def append_event(conn: asyncpg.Connection, codec: PayloadCodec, execution_id: str, body: Any) -> int:
    """Add the next event of an execution to the outbox; returns its seq.

    The seq is taken from the row in this same transaction, so seqs are contiguous even when
    several transactions of one execution race. The envelope is packed here (a big body goes
    to object storage first) and stored as the exact bytes that will be published.
    """
    header = await conn.fetchrow(
        "UPDATE executions SET last_seq = last_seq + 1, updated_at = now() WHERE execution_id = $1 "
        "RETURNING last_seq, namespace, session_id, request_digest",
        execution_id,
    )
    if header is None:
        raise NotFoundError(f"execution {execution_id} is not in the ledger")
    return await _insert_event(conn, codec, execution_id, header, body)


async def move_and_append(
    conn: asyncpg.Connection,
    codec: PayloadCodec,
    row: Execution,
    new: LedgerStatus,
    body: Any,
    *,
    unless_cancelled: bool = False,
    **changes: Any,
) -> Execution:
    """:func:`move` and :func:`append_event` together; returns the row as it is now.

    Guarded: the change applies only while the stored row still has ``row``'s owner, status
    and ``last_seq``, else ConflictError and nothing is written. A row this transaction locked
    always matches. On PostgreSQL the status change and the event are one statement, atomic on
    its own, so a caller that knows the row may even run it without a transaction around it
    (see ``Executor.save``); the event's seq is then known before the statement.

    ``unless_cancelled``: also only while no cancel was asked for (a start: a cancel committed
    meanwhile by any worker of the pool makes the locked path look at the row again).
    """
    sets, values = _status_change(row, new, False, changes)
    n = len(values) + 2
    guard = f"execution_id = $1 AND owner = ${n} AND status = ${n + 1} AND last_seq = ${n + 2}"
    if unless_cancelled:
        guard += " AND NOT cancel_requested"
    guard_values = [row.owner, row.status.value, row.last_seq]
    if dialect(conn) == "postgres":
        kind, payload = await _pack_event(codec, row.execution_id, _header(row), row.last_seq + 1, body)
        rec = await conn.fetchrow(
            f"""WITH moved AS (
                    UPDATE executions SET {sets}, last_seq = last_seq + 1, updated_at = now()
                     WHERE {guard} RETURNING *),
                event AS (
                    INSERT INTO events (execution_id, seq, kind, payload)
                    SELECT execution_id, last_seq, ${n + 3}, ${n + 4} FROM moved)
                SELECT * FROM moved""",
            row.execution_id,
            *values,
            *guard_values,
            kind,
            payload,
        )
    else:
        rec = await conn.fetchrow(
            f"UPDATE executions SET {sets}, last_seq = last_seq + 1, updated_at = now()"
            f" WHERE {guard} RETURNING *",
            row.execution_id,
            *values,
            *guard_values,
        )
        if rec is not None:
            await _insert_event(conn, codec, row.execution_id, rec, body)
    if rec is None:
        raise ConflictError(
            f"execution {row.execution_id} is no longer {row.status.value} at seq {row.last_seq} "
            f"under owner {row.owner}; nothing was changed"
        )
    return Execution.from_record(rec)


def _header(row: Execution | dict[str, Any]) -> dict[str, Any]:
    get = row.get if isinstance(row, dict) else lambda k: getattr(row, k)
    return {k: get(k) for k in ("namespace", "session_id", "request_digest")}


async def _pack_event(
    codec: PayloadCodec, execution_id: str, header: Any, seq: int, body: Any
) -> tuple[str, bytes]:
    """The event envelope for ``body`` as seq ``seq``, packed (a big body is uploaded here)."""
    envelope = _EVENT_CLASSES[type(body)](
        execution_id=execution_id,
        namespace=header["namespace"],
        session_id=header["session_id"],
        request_digest=header["request_digest"],
        seq=seq,
        body=body,
    )
    return str(envelope.kind), await codec.pack(envelope)


async def _insert_event(
    conn: asyncpg.Connection, codec: PayloadCodec, execution_id: str, header: asyncpg.Record, body: Any
) -> int:
    seq = int(header["last_seq"])
    kind, payload = await _pack_event(codec, execution_id, header, seq, body)
    await conn.execute(
        "INSERT INTO events (execution_id, seq, kind, payload) VALUES ($1, $2, $3, $4)",
        execution_id,
        seq,
        kind,
        payload,
    )
    return seq


async def pending_events(
    conn: asyncpg.Connection,
    *,
    route: str | None = None,
    execution_ids: list[str] | None = None,
    older_than: float | None = None,
    limit: int = 500,
) -> list[PendingEvent]:
    """Unpublished events, in (execution, seq) order: of the given executions, or (for the
    periodic scan) of ``route`` that have been due for more than ``older_than`` seconds."""
    where = ["ev.published_at IS NULL"]
    args: list[Any] = []
    if execution_ids is not None:
        args.append(list(execution_ids))
        where.append(f"ev.execution_id = ANY(${len(args)}::text[])")
    if older_than is not None:
        args.append(older_than)
        where.append(f"ev.pending_since < now() - make_interval(secs => ${len(args)})")
    if route is not None:
        args.append(route)
        where.append(f"e.route = ${len(args)}")
    args.append(limit)
    recs = await conn.fetch(
        f"""SELECT ev.execution_id, ev.seq, ev.payload, ev.pending_since
            FROM events ev JOIN executions e USING (execution_id)
            WHERE {" AND ".join(where)}
            ORDER BY ev.execution_id, ev.seq LIMIT ${len(args)}""",
        *args,
    )
    return [PendingEvent(r["execution_id"], r["seq"], bytes(r["payload"]), r["pending_since"]) for r in recs]


async def mark_published(conn: asyncpg.Connection, events: list[PendingEvent]) -> int:
    """Mark confirmed events published, unless a replay request made them due again meanwhile.

    Returns how many it marked. On PostgreSQL this is one statement, atomic on its own, so
    the relay runs it without a transaction around it (no BEGIN/COMMIT round trips).
    """
    if not events:
        return 0
    if dialect(conn) == "postgres":
        status = await conn.execute(
            """UPDATE events ev SET published_at = now()
                 FROM unnest($1::text[], $2::int[], $3::timestamptz[]) AS m(execution_id, seq, since)
                WHERE ev.execution_id = m.execution_id AND ev.seq = m.seq
                  AND ev.pending_since = m.since AND ev.published_at IS NULL""",
            [e.execution_id for e in events],
            [e.seq for e in events],
            [e.pending_since for e in events],
        )
        return int(status.split()[-1])
    marked = 0
    async with conn.transaction():  # SQLite: one fsync for the batch
        for e in events:
            status = await conn.execute(
                """UPDATE events SET published_at = now()
                   WHERE execution_id = $1 AND seq = $2 AND pending_since = $3 AND published_at IS NULL""",
                e.execution_id,
                e.seq,
                e.pending_since,
            )
            marked += int(status.split()[-1])
    return marked


async def republish_from(conn: asyncpg.Connection, execution_id: str, from_seq: int) -> int:
    """Make events with ``seq >= from_seq`` due again (a replay request); returns how many."""
    result = await conn.execute(
        # Strictly later than before, even within one clock tick, so that a relay holding
        # the old stamp cannot mark the replayed event published (see mark_published).
        "UPDATE events SET published_at = NULL,"
        " pending_since = GREATEST(clock_timestamp(), pending_since + make_interval(secs => 0.001)) "
        "WHERE execution_id = $1 AND seq >= $2",
        execution_id,
        from_seq,
    )
    return int(result.split()[-1])


async def list_events(conn: asyncpg.Connection, execution_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT seq, kind, payload, created_at, published_at FROM events "
        "WHERE execution_id = $1 ORDER BY seq",
        execution_id,
    )


# ---- reconciliations --------------------------------------------------------------------


async def insert_reconciliation(
    conn: asyncpg.Connection,
    execution_id: str,
    *,
    outcome: LedgerStatus,
    result: Any,
    error: dict[str, str] | None,
    evidence: str,
    actor: str,
) -> int:
    rid: int = await conn.fetchval(
        "INSERT INTO reconciliations (execution_id, outcome, result, error, evidence, actor) "
        "VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
        execution_id,
        LedgerStatus(outcome).value,
        Json(result),
        error,
        evidence,
        actor,
    )
    return rid


async def list_reconciliations(conn: asyncpg.Connection, execution_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT id, outcome, result, error, evidence, actor, at FROM reconciliations "
        "WHERE execution_id = $1 ORDER BY id",
        execution_id,
    )
