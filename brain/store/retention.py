"""What retention prunes from the Brain's store (``infra.db.retention`` runs it).

The journal is the conversation a thread's model sees, so it is kept as long as the session can
go on: only the entries of sessions closed for longer than the horizon go. A closed session
takes no turn, and closing waits for every turn to finish; the statement checks that no turn
is unfinished all the same, so that nothing a run may still read is ever pruned.
The session row stays, with its last seq: a cursor into what was pruned answers 410 (take a
snapshot), never an empty page that looks like the end.
"""

from __future__ import annotations

from brain.store.part import Part
from brain.store.sql import TERMINAL_SQL
from infra.db import Connection


class RetentionRows(Part):
    async def prune_journal(self, conn: Connection, horizon_seconds: float, limit: int) -> int:
        """Delete the journal of up to ``limit`` sessions closed ``horizon_seconds`` ago or more;
        returns how many sessions' journals went."""
        gone = await conn.fetch(
            f"""DELETE FROM journal WHERE session_id IN (
                   SELECT s.id FROM sessions s
                    WHERE s.closed_at < ts_add(now(), $1)
                      AND EXISTS (SELECT 1 FROM journal j WHERE j.session_id = s.id)
                      AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.session_id = s.id
                                         AND t.status NOT IN {TERMINAL_SQL})
                    ORDER BY s.id LIMIT $2)
               RETURNING session_id""",
            -horizon_seconds,
            limit,
        )
        return len({r["session_id"] for r in gone})
