"""What retention prunes from a Hands ledger (``infra.db.retention`` runs it).

Only finished executions go (SUCCEEDED, FAILED, CANCELLED: no way out of them), with their
output pages, once nothing has changed them for the horizon. An open execution is being worked
on and an UNKNOWN one waits for a person: neither is ever touched. The audit record of each
reconcile (``reconciliations``) is kept. A row's absence must not let a late copy of its
command run again: commands older than the horizon are judged by their age instead
(``hands.run.worker``, ``infra.db.retention.may_have_been_pruned``).
"""

from __future__ import annotations

from hands.rules.states import TERMINAL_STATUSES
from infra.db import Connection

_FINISHED = ", ".join(f"'{s.value}'" for s in sorted(TERMINAL_STATUSES))
# The oldest finished executions first; the same rows for both statements of one prune (a
# finished row never changes again, and the cutoff is fixed once per prune).
_PRUNABLE = f"""SELECT execution_id FROM executions
                 WHERE status IN ({_FINISHED}) AND updated_at < $1
                 ORDER BY updated_at, execution_id LIMIT $2"""


class LedgerRetention:
    async def prune_finished(self, conn: Connection, horizon_seconds: float, limit: int) -> int:
        """Delete up to ``limit`` executions finished ``horizon_seconds`` ago or more, and their
        output; returns how many executions went."""
        cutoff = await conn.fetchval("SELECT ts_add(now(), $1)", -horizon_seconds)
        await conn.execute(f"DELETE FROM output_chunks WHERE execution_id IN ({_PRUNABLE})", cutoff, limit)
        gone = await conn.fetch(
            f"DELETE FROM executions WHERE execution_id IN ({_PRUNABLE}) RETURNING execution_id",
            cutoff,
            limit,
        )
        return len(gone)
