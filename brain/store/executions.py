"""A turn's executions as the Brain reads them: a step's, a turn's, by id, the one an envelope names
(with its scope checked), the one a person answers, and those not settled yet. Applying the
events Hands send is ``brain.store.events``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from brain.rules.submits import session_key
from brain.store.part import Part
from brain.store.sql import UNSETTLED_SQL
from infra.db import Connection, Row


class Executions(Part):
    async def step_execution_ids(self, conn: Connection, turn_id: str, tool_step: int) -> list[str]:
        rows = await conn.fetch(
            "SELECT id FROM executions WHERE turn_id = $1 AND tool_step = $2 ORDER BY call_id",
            turn_id,
            tool_step,
        )
        return [r["id"] for r in rows]

    async def step_executions(self, conn: Connection, turn_id: str, tool_step: int) -> list[Row]:
        """A step's executions, by call id (``status``, ``result``, ``error``, ``how``...)."""
        return list(
            await conn.fetch(
                "SELECT * FROM executions WHERE turn_id = $1 AND tool_step = $2 ORDER BY call_id",
                turn_id,
                tool_step,
            )
        )

    async def steps_executions(
        self, conn: Connection, steps: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], list[Row]]:
        """``step_executions`` of several (turn id, tool step) pairs (one statement where the
        backend can)."""
        return {step: await self.step_executions(conn, *step) for step in dict.fromkeys(steps)}

    async def turn_executions(self, conn: Connection, turn_id: str) -> list[Row]:
        """Every execution of a turn, by step and call id."""
        return list(
            await conn.fetch(
                "SELECT * FROM executions WHERE turn_id = $1 ORDER BY tool_step, call_id", turn_id
            )
        )

    async def executions_by_id(self, conn: Connection, ids: Sequence[str]) -> dict[str, Row]:
        """Executions by id (what the tool messages of a conversation are made of)."""
        found = {}
        for execution_id in ids:
            row = await conn.fetchrow("SELECT * FROM executions WHERE id = $1", execution_id)
            if row is not None:
                found[execution_id] = row
        return found

    async def named_by(self, conn: Connection, header: Any) -> Row | None:
        """The execution an envelope names (its ``turn_id``, ``last_seq`` and ``turn_status``), if
        the envelope's scope and request digest are that execution's (else None)."""
        return await conn.fetchrow(
            """SELECT e.turn_id, e.last_seq, t.status AS turn_status
                 FROM executions e JOIN turns t ON t.id = e.turn_id
                WHERE e.id = $1 AND t.namespace = $2 AND t.session_id = $3 AND e.request_digest = $4""",
            header.execution_id,
            header.namespace,
            session_key(header.namespace, header.session_id),
            header.request_digest,
        )

    async def execution_for_call(self, conn: Connection, turn_id: str, call: str) -> Row | None:
        """The turn's execution of a call, by call id or execution id."""
        return await conn.fetchrow(
            """SELECT id, turn_id, call_id, tool, route, status, how, tool_step, request_digest
                 FROM executions
                WHERE turn_id = $1 AND (call_id = $2 OR id = $2) ORDER BY tool_step DESC LIMIT 1""",
            turn_id,
            call,
        )

    async def open_executions(self, conn: Connection, turn_id: str) -> list[Row]:
        """A turn's executions that are not settled (UNKNOWN ones are: only a reconcile moves them)."""
        return list(
            await conn.fetch(
                f"""SELECT id, route, request_digest, call_id, tool, status FROM executions
                     WHERE turn_id = $1 AND status IN {UNSETTLED_SQL} ORDER BY id""",
                turn_id,
            )
        )

    async def unknown(self, conn: Connection, limit: int) -> list[Row]:
        """UNKNOWN executions of every namespace, oldest first, with why each is (its error) and
        where it belongs: what an operator reconciles."""
        return list(
            await conn.fetch(
                """SELECT e.id, e.turn_id, t.namespace, t.session_id, e.call_id, e.tool, e.route, e.attempts,
                          e.worker, e.error, e.created_at, e.updated_at
                     FROM executions e JOIN turns t ON t.id = e.turn_id
                    WHERE e.status = 'unknown' ORDER BY e.updated_at, e.id LIMIT $1""",
                limit,
            )
        )

    async def output(
        self, conn: Connection, namespace: str, execution_id: str, offset: int, limit: int
    ) -> tuple[Row, list[Row]] | None:
        """An execution of ``namespace`` (its status and output bytes) and its output pages from
        byte ``offset`` on, at most ``limit`` of them; None when it is not there."""
        row = await conn.fetchrow(
            """SELECT e.id, e.status, e.output_bytes FROM executions e JOIN turns t ON t.id = e.turn_id
                WHERE e.id = $1 AND t.namespace = $2""",
            execution_id,
            namespace,
        )
        if row is None:
            return None
        pages = await conn.fetch(
            """SELECT byte_offset, data FROM execution_output
                WHERE execution_id = $1 AND byte_offset >= $2 ORDER BY byte_offset LIMIT $3""",
            execution_id,
            offset,
            limit,
        )
        return row, list(pages)
