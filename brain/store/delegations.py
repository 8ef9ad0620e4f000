"""Delegations on the Brain's side (``brain.rules.delegation``): the parent-child record, the calls
whose child is to be accepted, the children that ended, and those whose parent's call ended first.

A delegated call is a PENDING execution whose ``wait_key`` says its child is to be accepted; the
commit that accepts the child (``Submits.submit_in``) writes this record and clears that key, so
another pass or another Brain finds the record and never starts a second child (invariant 19).
Every look locks what it takes (another Brain's pass skips it).
"""

from __future__ import annotations

from typing import Any

from brain.rules.delegation import OPEN_DELEGATION, TO_START, DelegationStatus
from brain.store.part import Part
from brain.store.sql import TERMINAL_SQL, delegation_becomes, in_list
from infra.db import Connection, Json

OPEN = f"d.status IN {in_list(OPEN_DELEGATION)}"  # the partial index's own words
_OVER_BUDGET = delegation_becomes(DelegationStatus.OVER_BUDGET)
_SETTLED = delegation_becomes(DelegationStatus.SETTLED)
COLUMNS = (
    "d.execution_id, d.namespace, d.session_id, d.parent_turn_id, d.parent_thread_id, d.call_id, d.tool, "
    "d.agent_name, d.agent_version, d.child_thread_id, d.child_turn_id, d.chain, d.budget, d.on_budget, "
    "d.deadline, d.status, d.reason, d.cancel_control, d.created_at"
)


class Delegations(Part):
    async def to_start(self, conn: Connection, limit: int) -> list[Any]:
        """Delegated calls whose child is not accepted yet, locked, with their turn."""
        return list(
            await conn.fetch(
                f"""SELECT e.id, e.turn_id, e.call_id, e.tool, e.tool_step, e.status, t.namespace,
                           t.session_id, t.thread_id, t.status AS turn_status, t.phase
                      FROM executions e JOIN turns t ON t.id = e.turn_id
                     WHERE e.wait_key = '{TO_START}'
                     ORDER BY e.created_at, e.id LIMIT $1{self.store.SKIP_LOCKED}""",
                limit,
            )
        )

    async def record(self, conn: Connection, e: Any, values: dict[str, Any]) -> None:
        """Write the record of call ``e`` (its child, or why it has none) and take the call off
        the calls to start, in the caller's transaction."""
        await conn.execute(
            """INSERT INTO delegations (execution_id, namespace, session_id, parent_turn_id, parent_thread_id,
                                        call_id, tool, agent_name, agent_version, child_thread_id,
                                        child_turn_id, chain, budget, on_budget, deadline, status, reason)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, ts_add(now(), $15),
                       $16, $17)
               ON CONFLICT DO NOTHING""",
            e["id"],
            e["namespace"],
            e["session_id"],
            e["turn_id"],
            e["thread_id"],
            e["call_id"],
            e["tool"],
            values["agent_name"],
            values["agent_version"],
            values.get("child_thread_id"),
            values.get("child_turn_id"),
            Json(values["chain"]),
            Json(values["budget"]),
            values["on_budget"],
            values.get("seconds"),
            str(values["status"]),
            values.get("reason"),
        )
        await conn.execute("UPDATE executions SET wait_key = NULL WHERE id = $1", e["id"])

    async def of_child(self, conn: Connection, child_turn_id: str) -> Any:
        """The record that started this turn (None: no delegation did)."""
        return await conn.fetchrow(
            f"SELECT {COLUMNS} FROM delegations d WHERE d.child_turn_id = $1", child_turn_id
        )

    async def children_of(self, conn: Connection, parent_turn_id: str) -> list[Any]:
        """The records of a turn's delegated calls, in the order they were made."""
        return list(
            await conn.fetch(
                f"""SELECT {COLUMNS}, c.status AS child_status FROM delegations d
                      LEFT JOIN turns c ON c.id = d.child_turn_id
                     WHERE d.parent_turn_id = $1 ORDER BY d.created_at, d.execution_id""",
                parent_turn_id,
            )
        )

    async def ended(self, conn: Connection, limit: int) -> list[Any]:
        """Open records whose child ended, locked, with the child's end and the parent's call."""
        return list(
            await conn.fetch(
                f"""SELECT {COLUMNS}, c.status AS child_status, c.result AS child_result,
                           c.error AS child_error, e.status AS call_status, e.tool_step,
                           p.status AS parent_status, p.phase AS parent_phase
                      FROM delegations d JOIN turns c ON c.id = d.child_turn_id
                      JOIN executions e ON e.id = d.execution_id JOIN turns p ON p.id = d.parent_turn_id
                     WHERE {OPEN} AND c.status IN {TERMINAL_SQL}
                     ORDER BY d.parent_turn_id, d.execution_id LIMIT $1{self.store.SKIP_LOCKED}""",
                limit,
            )
        )

    async def to_cancel(self, conn: Connection, limit: int) -> list[Any]:
        """Open records whose child is still going and should not: the parent's call ended
        (its turn was cancelled or failed), or the child's time budget ran out. Not locked: the
        cancel is a control, idempotent by its request id."""
        return list(
            await conn.fetch(
                f"""SELECT {COLUMNS}, e.status AS call_status, d.deadline <= now() AS late
                      FROM delegations d JOIN turns c ON c.id = d.child_turn_id
                      JOIN executions e ON e.id = d.execution_id
                     WHERE {OPEN} AND d.cancel_control IS NULL AND c.status NOT IN {TERMINAL_SQL}
                       AND (e.status <> 'pending' OR d.deadline <= now())
                     ORDER BY d.created_at LIMIT $1""",
                limit,
            )
        )

    async def cancel_asked(
        self, conn: Connection, execution_id: str, reason: str, control_id: int, *, over_budget: bool
    ) -> bool:
        """Note the cancel asked of a record's child (over its time budget: the record says so);
        False when it was noted already."""
        became = f"{_OVER_BUDGET.set}, " if over_budget else ""
        guard = f" AND {_OVER_BUDGET.guard}" if over_budget else ""
        status = await conn.execute(
            f"""UPDATE delegations SET {became}reason = $2, cancel_control = $3
                 WHERE execution_id = $1 AND cancel_control IS NULL{guard}""",
            execution_id, reason, control_id,
        )  # fmt: skip
        return str(status).endswith(" 1")

    async def settled(self, conn: Connection, execution_id: str) -> None:
        """The record's call took its child's end."""
        await conn.execute(
            f"UPDATE delegations SET {_SETTLED.set}, settled_at = now()"
            f" WHERE execution_id = $1 AND {_SETTLED.guard}",
            execution_id,
        )
