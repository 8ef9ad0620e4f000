"""The lifecycle rows of sandbox bindings, and the executions that use them.

Every status write goes through the state table (``hands.sandbox.rules.states``) and is guarded
by the status it read, so two workers never both move one row. A creation or a deletion is done
under the row's lease: its owner and a time; a lease whose owner is dead in ``workers`` (or whose
time ran out) is free, so a replaced host's chores are taken over. Every function takes the
``conn`` of a transaction its caller owns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from hands.sandbox.rules.states import SandboxStatus, transition
from infra.db import Connection
from infra.db.store import StoreBase
from infra.liveness import ALIVE_SQL


@dataclass(frozen=True)
class SandboxRow:
    namespace: str
    binding_id: str
    owner_session: str
    definition: str
    definition_version: str
    config_ref: str
    identity: str
    nonce: str
    generation: int
    status: SandboxStatus
    attempts: int
    error: str | None
    lease_owner: str | None
    lease_until: datetime | None
    due_at: datetime | None
    evidence: str | None
    actor: str | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> SandboxRow:
        data = {f.name: rec[f.name] for f in fields(cls)}
        data["status"] = SandboxStatus(data["status"])
        return cls(**data)

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["status"] = self.status.value
        for key, value in out.items():
            if isinstance(value, datetime):
                out[key] = value.isoformat()
        return out


COLUMNS = ", ".join(f.name for f in fields(SandboxRow))
_KEY = "namespace = $1 AND binding_id = $2"


def _lease_free(me: str) -> str:
    """SQL: the lease is free for the worker in parameter ``me`` (``$n``)."""
    return (
        f"(lease_owner IS NULL OR lease_until < now() OR lease_owner = {me} OR NOT EXISTS "
        f"(SELECT 1 FROM workers w WHERE w.id = sandboxes.lease_owner AND {ALIVE_SQL}))"
    )


class SandboxRows(StoreBase):
    """The portable statements (SQLite, the embedded mode)."""

    async def get(
        self, conn: Connection, namespace: str, binding: str, *, for_update: bool = False
    ) -> SandboxRow | None:
        lock = self.FOR_UPDATE if for_update else ""
        rec = await conn.fetchrow(f"SELECT {COLUMNS} FROM sandboxes WHERE {_KEY}{lock}", namespace, binding)
        return SandboxRow.from_record(rec) if rec is not None else None

    async def begin(
        self, conn: Connection, values: Mapping[str, Any], old: SandboxRow | None, lease_seconds: float
    ) -> SandboxRow | None:
        """Commit a creation's identity, under ``values["lease_owner"]``'s lease, before the provider
        is asked: a new row, or a deleted one's next generation (the table allows DELETED ->
        CREATING, nothing else). The chore scan looks at it once the lease ran out. None when
        another transaction made the row first (read it again)."""
        if old is not None:
            transition(old.status, SandboxStatus.CREATING)
            await conn.execute(f"DELETE FROM sandboxes WHERE {_KEY} AND status = 'deleted'", *_key(old))
        n = len(values)
        marks = ", ".join(f"${i}" for i in range(1, n + 2))
        rec = await conn.fetchrow(
            f"""INSERT INTO sandboxes ({", ".join(values)}, status, lease_until, due_at)
                VALUES ({marks}, ts_add(now(), ${n + 2}), ts_add(now(), ${n + 2}))
                ON CONFLICT (namespace, binding_id) DO NOTHING RETURNING {COLUMNS}""",
            *values.values(),
            SandboxStatus.CREATING.value,
            lease_seconds,
        )
        return SandboxRow.from_record(rec) if rec is not None else None

    async def take_lease(
        self, conn: Connection, row: SandboxRow, me: str, seconds: float
    ) -> SandboxRow | None:
        """The row's lease for ``me`` (None while a live other holds it)."""
        rec = await conn.fetchrow(
            f"""UPDATE sandboxes SET lease_owner = $3, lease_until = ts_add(now(), $4), updated_at = now()
                 WHERE {_KEY} AND status = $5 AND {_lease_free("$3")} RETURNING {COLUMNS}""",
            *_key(row),
            me,
            seconds,
            row.status.value,
        )
        return SandboxRow.from_record(rec) if rec is not None else None

    async def move(
        self,
        conn: Connection,
        row: SandboxRow,
        new: SandboxStatus,
        *,
        me: str | None = None,
        reconcile: bool = False,
        due_in: float | None = None,
        **values: Any,
    ) -> SandboxRow | None:
        """``row`` to ``new`` (the table decides), guarded by the status it had and, with ``me``, by
        the lease ``me`` holds; releases the lease. None if the guard failed (someone moved it)."""
        transition(row.status, new, reconcile=reconcile)
        sets = ", ".join(f"{name} = ${i}" for i, name in enumerate(values, start=6))
        # Without ``me`` (a request, a reconcile) any lease holder's work is overtaken by the status guard.
        lease = "AND coalesce(lease_owner, '') = coalesce($4, lease_owner, '')"
        rec = await conn.fetchrow(
            f"""UPDATE sandboxes SET status = $3, lease_owner = NULL, lease_until = NULL,
                       due_at = ts_add(now(), $5), updated_at = now(){", " + sets if sets else ""}
                 WHERE {_KEY} AND status = '{row.status.value}' {lease} RETURNING {COLUMNS}""",
            *_key(row),
            new.value,
            me,
            due_in,
            *values.values(),
        )
        return SandboxRow.from_record(rec) if rec is not None else None

    async def postpone(
        self, conn: Connection, row: SandboxRow, me: str, due_in: float | None, **values: Any
    ) -> None:
        """Release ``me``'s lease and look again in ``due_in`` seconds (None: only when asked)."""
        sets = "".join(f", {name} = ${i}" for i, name in enumerate(values, start=5))
        await conn.execute(
            f"""UPDATE sandboxes SET lease_owner = NULL, lease_until = NULL, due_at = ts_add(now(), $4),
                       updated_at = now(){sets} WHERE {_KEY} AND lease_owner = $3""",
            *_key(row),
            me,
            due_in,
            *values.values(),
        )

    async def add_use(self, conn: Connection, row: SandboxRow, execution_id: str) -> None:
        await conn.execute(
            "INSERT INTO sandbox_uses (namespace, binding_id, execution_id) VALUES ($1, $2, $3)"
            " ON CONFLICT DO NOTHING",
            *_key(row),
            execution_id,
        )

    async def uses(self, conn: Connection, row: SandboxRow, execution_id: str) -> bool:
        found = await conn.fetchval(
            f"SELECT 1 FROM sandbox_uses WHERE {_KEY} AND execution_id = $3", *_key(row), execution_id
        )
        return found is not None

    async def open_users(self, conn: Connection, row: SandboxRow) -> list[str]:
        """The executions using the binding that are still open in the ledger (not settled)."""
        recs = await conn.fetch(
            """SELECT u.execution_id FROM sandbox_uses u JOIN executions e USING (execution_id)
                 WHERE u.namespace = $1 AND u.binding_id = $2 AND e.open ORDER BY u.execution_id""",
            *_key(row),
        )
        return [r["execution_id"] for r in recs]

    async def forget_settled_uses(self, conn: Connection, row: SandboxRow) -> int:
        """Forget the uses whose execution is no longer open (or no longer in the ledger): only
        open ones hold a deletion back or may go on in a deleting binding."""
        status = await conn.execute(
            f"""DELETE FROM sandbox_uses WHERE {_KEY} AND NOT EXISTS (SELECT 1 FROM executions e
                 WHERE e.execution_id = sandbox_uses.execution_id AND e.open)""",
            *_key(row),
        )
        return int(str(status).split()[-1])

    async def forget_uses(self, conn: Connection, row: SandboxRow) -> None:
        await conn.execute(f"DELETE FROM sandbox_uses WHERE {_KEY}", *_key(row))

    async def due(self, conn: Connection, me: str, limit: int) -> list[SandboxRow]:
        """Rows whose chore is due and whose lease is free (for ``me``)."""
        recs = await conn.fetch(
            f"""SELECT {COLUMNS} FROM sandboxes WHERE due_at <= now() AND {_lease_free("$1")}
                 ORDER BY due_at LIMIT $2""",
            me,
            limit,
        )
        return [SandboxRow.from_record(r) for r in recs]

    async def listing(self, conn: Connection, namespace: str | None) -> list[SandboxRow]:
        recs = await conn.fetch(
            f"SELECT {COLUMNS} FROM sandboxes WHERE namespace = coalesce($1, namespace)"
            " ORDER BY namespace, binding_id",
            namespace,
        )
        return [SandboxRow.from_record(r) for r in recs]


class PostgresSandboxRows(SandboxRows):
    """The same statements on PostgreSQL, with the row locks SQLite needs none of."""

    FOR_UPDATE = " FOR UPDATE"
    SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"
    ONE_STATEMENT_COMMITS = True


def _key(row: SandboxRow) -> tuple[str, str]:
    return row.namespace, row.binding_id
