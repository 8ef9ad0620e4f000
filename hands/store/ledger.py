"""The Hands ledger: the pool's own record of executions, output and reconciliations.

Every state change of an execution is one UPDATE of its row that also appends its status events
(``events``, the packed envelopes in seq order); output pages are rows of ``output_chunks``
with their seq. So a commit writes each fact once, and the relay publishes what the commit hands
it; a replay, or a command that comes again, reads the row.

The portable statements, one row at a time; ``hands.store.postgres`` does the same for many rows
per statement. Every function takes the ``conn`` of a transaction its caller owns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hands.rules.states import OPEN_STATUSES, LedgerStatus, transition
from hands.store.records import EXECUTION_COLUMNS, Change, Execution, NewExecution
from hands.store.retention import LedgerRetention
from infra.db import Connection, Json
from infra.db.parked import ParkedRows
from infra.db.store import StoreBase
from infra.liveness import ALIVE_SQL
from protocol import NotFoundError, StaleOwnerError, codec

# An owner missing from ``workers`` counts as dead too: NOT EXISTS covers both. An owner presumed
# dead has its open rows handed to a released name already (``release_owners``).
_OWNER_DEAD = f"NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = e.owner AND {ALIVE_SQL})"
# A parked row (``Ledger.park``) is an orphan only once its wake time came.
_DUE = "(e.wake_at IS NULL OR e.wake_at <= now())"
# What an answer or a cancel does to a parked row: it is taken up again at the next scan.
_WAKE_NOW = "wake_at = CASE WHEN wake_at IS NULL THEN NULL ELSE now() END"
PARKED_PREFIX = "parked-by:"
_CHANGE_SET = """status = $2, open = $3, attempts = coalesce($4, attempts), error = coalesce($5, error),
                 output_bytes = coalesce($6, output_bytes), last_seq = $7, events = {append},
                 updated_at = now()"""
_CHANGE_GUARD = (
    "execution_id = $1 AND owner = $8 AND status = $9 AND last_seq = $10"
    " AND ($11 = false OR NOT cancel_requested)"
)


def change_values(c: Change) -> list[Any]:
    """The parameters of a guarded change, in order ($1..$11; the events go last, $12)."""
    b = c.before
    return [
        b.execution_id, str(c.status), c.open, c.attempts, Json(c.error) if c.error is not None else None,
        c.output_bytes, b.last_seq + len(c.events), b.owner, str(b.status), b.last_seq, c.unless_cancelled,
    ]  # fmt: skip


class Ledger(StoreBase, LedgerRetention, ParkedRows):
    """The portable ledger (SQLite, the embedded mode)."""

    # ---- executions --------------------------------------------------------------------

    # How a change appends its events to the row's ($12): here the whole new list, which the
    # change's guard (the row's last seq) proves is the old one plus the new events.
    APPEND = "$12"

    def appended(self, change: Change) -> list[dict[str, Any]]:
        return change.before.events + change.events

    async def insert(self, conn: Connection, rows: Sequence[NewExecution]) -> list[Execution | None]:
        """Insert new rows with their first events; None for an id already in the ledger (then
        nothing of it is written)."""
        out = []
        for new in rows:
            values = {**new.values, "events": new.events, "last_seq": len(new.events)}
            values["status"] = LedgerStatus(values["status"]).value
            values["open"] = LedgerStatus(values["status"]) in OPEN_STATUSES
            if "args" in values and values["args"] is not None:
                values["args"] = Json(values["args"])
            columns = list(values)
            marks = ", ".join(f"${i}" for i in range(1, len(columns) + 1))
            rec = await conn.fetchrow(
                f"INSERT INTO executions ({', '.join(columns)}) VALUES ({marks})"
                f" ON CONFLICT (execution_id) DO NOTHING RETURNING {EXECUTION_COLUMNS}",
                *values.values(),
            )
            out.append(Execution.from_record(rec) if rec is not None else None)
        return out

    async def exists(self) -> bool:
        """Whether the pool holds a ledger at all (its migrations ran there)."""
        return bool(
            await self.read(
                lambda c: c.fetchval("SELECT count(*) FROM sqlite_master WHERE name = 'executions'")
            )
        )

    async def get(self, conn: Connection, execution_id: str, *, for_update: bool = False) -> Execution | None:
        lock = self.FOR_UPDATE if for_update else ""
        rec = await conn.fetchrow(
            f"SELECT {EXECUTION_COLUMNS} FROM executions WHERE execution_id = $1{lock}", execution_id
        )
        return Execution.from_record(rec) if rec is not None else None

    async def lock_owned(self, conn: Connection, execution_id: str, owner: str) -> Execution:
        """Lock the row for this transaction and check that ``owner`` still owns it (fencing).

        Ownership only moves away from a worker that looked dead (see :meth:`claim_orphan`); a
        worker that was merely cut off and comes back gets StaleOwnerError instead of a commit.
        """
        row = await self.get(conn, execution_id, for_update=True)
        if row is None:
            raise NotFoundError(f"execution {execution_id} is not in the ledger")
        if row.owner != owner:
            raise StaleOwnerError(
                f"execution {execution_id} is owned by {row.owner} now, not {owner}; "
                "this worker's commit is refused"
            )
        return row

    async def owns(self, conn: Connection, execution_id: str, owner: str) -> bool:
        """Whether ``owner`` still holds the execution open: nobody released it (a judgement, a
        retire) nor took it over, and it is not closed."""
        found = await conn.fetchval(
            "SELECT 1 FROM executions WHERE execution_id = $1 AND owner = $2 AND open", execution_id, owner
        )
        return found is not None

    async def write(
        self, conn: Connection, rows: Sequence[NewExecution], changes: Sequence[Change]
    ) -> tuple[list[Execution | None], list[Execution | None]]:
        """``insert`` and ``change`` together, for executions that are not both new and changed
        here. A backend whose statements commit on their own (``ONE_STATEMENT_COMMITS``) writes
        them with one statement: the writer sends no BEGIN and COMMIT around it."""
        return (
            await self.insert(conn, rows) if rows else [],
            await self.change(conn, changes) if changes else [],
        )

    async def change(self, conn: Connection, changes: Sequence[Change]) -> list[Execution | None]:
        """Apply guarded changes (see :class:`Change`); None for one whose guard refused it.
        Raises IllegalTransitionError (nothing written) for a move the table forbids."""
        for c in changes:
            transition(c.before.status, c.status)
        return [await self._change_one(conn, c) for c in changes]

    async def _change_one(self, conn: Connection, c: Change) -> Execution | None:
        rec = await conn.fetchrow(
            f"UPDATE executions SET {_CHANGE_SET.format(append=self.APPEND)} WHERE {_CHANGE_GUARD}"
            f" RETURNING {EXECUTION_COLUMNS}",
            *change_values(c),
            self.appended(c),
        )
        return Execution.from_record(rec) if rec is not None else None

    async def reconcile(self, conn: Connection, c: Change) -> Execution:
        """The one change only a person with evidence may make: UNKNOWN to an outcome, on a row
        this transaction locked."""
        transition(c.before.status, c.status, reconcile=True)
        row = await self._change_one(conn, c)
        assert row is not None, f"execution {c.before.execution_id} moved under its reconcile's lock"
        return row

    async def release(self, conn: Connection, execution_id: str, owner: str) -> bool:
        """Hand an open execution of ``owner`` to a name no live worker has (see Executor)."""
        status = await conn.execute(
            """UPDATE executions SET owner = 'released-by:' || owner, updated_at = now()
                WHERE execution_id = $1 AND owner = $2 AND open""",
            execution_id,
            owner,
        )
        return str(status).endswith(" 1")

    async def release_owners(self, conn: Connection, owners: Sequence[str], died: bool = True) -> int:
        """Hand the open executions of workers presumed dead (or retiring) to released names no live
        worker has, in the transaction that records their death: from then on their late commits
        are refused (fenced by owner), and any worker's recovery scan takes them over by the replay
        rule. Returns how many."""
        released = 0
        for owner in owners:
            status = await conn.execute(
                """UPDATE executions SET owner = 'released-by:' || owner, updated_at = now()
                    WHERE owner = $1 AND open""",
                owner,
            )
            released += int(str(status).split()[-1])
        return released

    async def keep_handle(self, conn: Connection, execution_id: str, owner: str, handle: str) -> bool:
        """Record the durable handle of an open execution ``owner`` holds; False if it no longer
        holds it (fenced like a change: a worker presumed dead writes nothing)."""
        status = await conn.execute(
            """UPDATE executions SET handle = $3, updated_at = now()
                WHERE execution_id = $1 AND owner = $2 AND open""",
            execution_id,
            owner,
            handle,
        )
        return str(status).endswith(" 1")

    async def park(
        self, conn: Connection, execution_id: str, owner: str, handle: str, wake_in: float,
        awaiting: str | None,
    ) -> bool:  # fmt: skip
        """Park an open execution ``owner`` holds: it keeps ``handle`` (what its body follows) and
        goes to a name no live worker has, so no worker has it until ``wake_in`` seconds from now,
        when any worker's recovery scan takes it up (``open_orphans``). A cancel asked already, or
        the answer to question ``awaiting`` given already, makes it due at once (both wake a parked
        row when they come: ``request_cancel``, ``give_input``; checked here under the row's lock,
        so one that came while it was being parked is not left waiting for the wake time). False if
        ``owner`` no longer holds it."""
        row = await self.get(conn, execution_id, for_update=True)
        if row is None or row.owner != owner or row.status not in OPEN_STATUSES:
            return False
        answered = awaiting is not None and awaiting in (codec.loads(row.inputs) if row.inputs else {})
        await conn.execute(
            f"""UPDATE executions SET owner = '{PARKED_PREFIX}' || owner, handle = $2,
                       wake_at = ts_add(now(), $3), updated_at = now() WHERE execution_id = $1""",
            execution_id,
            handle,
            0.0 if answered or row.cancel_requested else float(wake_in),
        )
        return True

    async def give_input(self, conn: Connection, execution_id: str, key: str, answer: dict[str, Any]) -> bool:
        """Keep a person's answer to question ``key`` of an open execution; False when it has an
        answer to that key already (the first stands) or is not open any more."""
        row = await self.get(conn, execution_id, for_update=True)
        given = codec.loads(row.inputs) if row is not None and row.inputs else {}
        if row is None or row.status not in OPEN_STATUSES or key in given:
            return False
        given[key] = answer
        await conn.execute(
            f"UPDATE executions SET inputs = $2, {_WAKE_NOW}, updated_at = now() WHERE execution_id = $1",
            execution_id,
            codec.dumps(given).decode(),
        )
        return True

    async def request_cancel(self, conn: Connection, execution_id: str) -> Execution | None:
        rec = await conn.fetchrow(
            f"UPDATE executions SET cancel_requested = true, {_WAKE_NOW}, updated_at = now()"
            " WHERE execution_id = $1"
            f" RETURNING {EXECUTION_COLUMNS}",
            execution_id,
        )
        return Execution.from_record(rec) if rec is not None else None

    # ---- output ------------------------------------------------------------------------

    async def add_output(self, conn: Connection, row: Execution, data: str) -> tuple[int, int]:
        """Append one output page of ``row`` (locked); returns its (byte offset, seq)."""
        size = len(data.encode("utf-8"))
        rec = await conn.fetchrow(
            """UPDATE executions SET output_bytes = output_bytes + $2, last_seq = last_seq + 1,
                                     updated_at = now()
                WHERE execution_id = $1 RETURNING output_bytes - $2 AS offset, last_seq""",
            row.execution_id,
            size,
        )
        assert rec is not None, f"execution {row.execution_id} is not in the ledger"  # its caller locked it
        await conn.execute(
            "INSERT INTO output_chunks (execution_id, byte_offset, seq, data) VALUES ($1, $2, $3, $4)",
            row.execution_id,
            rec["offset"],
            rec["last_seq"],
            data,
        )
        return int(rec["offset"]), int(rec["last_seq"])

    async def has_output(self, conn: Connection, execution_id: str, offset: int, data: str) -> bool:
        """Whether the page ``data`` is stored at ``offset`` (did an unclear commit land?)."""
        found = await conn.fetchval(
            "SELECT data = $3 FROM output_chunks WHERE execution_id = $1 AND byte_offset = $2",
            execution_id,
            offset,
            data,
        )
        return bool(found)

    async def pages(self, conn: Connection, execution_id: str, from_seq: int) -> list[Any]:
        """Output pages with their seqs, from ``from_seq`` on (the pages of earlier versions, kept
        in the row's events, have no seq here)."""
        return list(
            await conn.fetch(
                "SELECT byte_offset, seq, data FROM output_chunks WHERE execution_id = $1 AND seq >= $2"
                " ORDER BY seq",
                execution_id,
                from_seq,
            )
        )

    # ---- recovery ----------------------------------------------------------------------

    async def open_orphans(self, conn: Connection, route: str, me: str, limit: int) -> list[tuple[str, str]]:
        """(execution_id, owner) of open executions of ``route`` whose owner is dead, oldest first."""
        recs = await conn.fetch(
            f"""SELECT e.execution_id, e.owner FROM executions e
                WHERE e.route = $1 AND e.open AND e.owner <> $2 AND {_OWNER_DEAD} AND {_DUE}
                ORDER BY e.updated_at LIMIT $3""",
            route,
            me,
            limit,
        )
        return [(r["execution_id"], r["owner"]) for r in recs]

    async def open_owned(self, conn: Connection, route: str, owner: str) -> list[tuple[str, bool]]:
        """Open executions of ``route`` that ``owner`` holds, oldest first, each with whether a
        cancel was asked for it: the rows the owner has no task for, and the cancels that reached
        another worker of the pool (see ``RecoveryScanner``)."""
        recs = await conn.fetch(
            "SELECT execution_id, cancel_requested FROM executions WHERE route = $1 AND owner = $2"
            " AND open ORDER BY updated_at",
            route,
            owner,
        )
        return [(r["execution_id"], bool(r["cancel_requested"])) for r in recs]

    async def claim_orphan(
        self, conn: Connection, execution_id: str, dead_owner: str, me: str
    ) -> Execution | None:
        """Compare-and-set the owner from ``dead_owner`` to ``me``; None if someone else won."""
        rec = await conn.fetchrow(
            f"""UPDATE executions AS e SET owner = $3, wake_at = NULL, updated_at = now()
                 WHERE e.execution_id = $1 AND e.owner = $2 AND e.open AND {_OWNER_DEAD} AND {_DUE}
             RETURNING {EXECUTION_COLUMNS}""",
            execution_id,
            dead_owner,
            me,
        )
        return Execution.from_record(rec) if rec is not None else None

    # ---- reconciliations ---------------------------------------------------------------

    async def insert_reconciliation(self, conn: Connection, execution_id: str, **audit: Any) -> int:
        rid: int = await conn.fetchval(
            """INSERT INTO reconciliations (execution_id, outcome, result, error, evidence, actor, request_id)
               VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id""",
            execution_id,
            LedgerStatus(audit["outcome"]).value,
            Json(audit["result"]),
            audit["error"],
            audit["evidence"],
            audit["actor"],
            audit.get("request_id"),
        )
        return rid

    async def list_reconciliations(self, conn: Connection, execution_id: str) -> list[Any]:
        return list(
            await conn.fetch(
                "SELECT id, outcome, result, error, evidence, actor, request_id, at, sent_at"
                " FROM reconciliations WHERE execution_id = $1 ORDER BY id",
                execution_id,
            )
        )

    async def unsent_reconciliations(self, conn: Connection, route: str) -> list[tuple[int, str]]:
        """(audit id, execution id) of this route's reconciliations whose event nobody published."""
        recs = await conn.fetch(
            """SELECT r.id, r.execution_id FROM reconciliations r JOIN executions e USING (execution_id)
                WHERE r.sent_at IS NULL AND e.route = $1 ORDER BY r.id""",
            route,
        )
        return [(r["id"], r["execution_id"]) for r in recs]

    async def reconciliation_sent(self, conn: Connection, audit_id: int) -> None:
        await conn.execute("UPDATE reconciliations SET sent_at = now() WHERE id = $1", audit_id)
