"""What running executions ask a person (an MCP task in ``input_required``), and their answers.

An ``input_required`` event leaves the execution RUNNING with ``how = 'awaiting_input'`` and what
it asks in ``input_request`` (its key, message and the server's requests), and says so in the
turn's ``waiting_for``; `brain respond` answers it: the answer goes to the Hands as an ``input``
control through the outbox, in the same commit that clears ``how`` and notes the answer's control
in ``input_request`` (so the same question asked again, by a worker that took the execution over,
is not asked of the person twice).
"""

from __future__ import annotations

from typing import Any

from brain.rules.applying import Effect
from brain.rules.submits import shown_session
from brain.store.part import Part
from infra.db import Connection, Json
from infra.transport import Topology
from protocol import InputBody, InputControl
from protocol.envelopes import new_id


class Inputs(Part):
    async def ask(self, conn: Connection, row: Any, done: Effect) -> None:
        """Record what execution ``row`` asks (``done.asked``: an applied ``input_required``),
        unless that question (its key) was answered already: then ``done`` forgets it."""
        asked = done.asked
        assert asked is not None
        before = await self.question(conn, row["id"])
        if before is not None and before.get("key") == asked["key"] and before.get("answered"):
            # asked again by a worker that took the execution over: its answer is on its way
            done.asked = None
            done.facts = [f for f in done.facts if f["kind"] != "execution.input_required"]
            return
        await conn.execute(
            "UPDATE executions SET input_request = $2, how = 'awaiting_input' WHERE id = $1",
            row["id"],
            Json(asked),
        )
        said = asked.get("message") or "input"
        await conn.execute(
            "UPDATE turns SET waiting_for = $2 WHERE id = $1",
            row["turn_id"],
            f"a person's input for call {row['call_id']} ({row['tool']}): {said}",
        )

    async def question(self, conn: Connection, execution_id: str) -> dict[str, Any] | None:
        value = await conn.fetchval("SELECT input_request FROM executions WHERE id = $1", execution_id)
        return dict(value) if value is not None else None

    async def give(
        self, conn: Connection, topology: Topology, turn: Any, execution: Any, body: InputBody
    ) -> bool:
        """Send ``body`` (the answer to the question the execution waits on) to its Hands, in the
        caller's commit; False when the execution no longer waits (then nothing is written)."""
        asked = await self.question(conn, execution["id"])
        done = await conn.fetchval(
            """UPDATE executions SET how = NULL, input_request = $2, updated_at = now()
                WHERE id = $1 AND how = 'awaiting_input' AND status = 'running' RETURNING id""",
            execution["id"],
            Json({**(asked or {}), "answered": body.request_id}),
        )
        if done is None:
            return False
        control = InputControl(
            message_id=new_id(),
            execution_id=execution["id"],
            namespace=turn.namespace,
            session_id=shown_session(turn.namespace, turn.session_id),  # the id the Hands know
            request_digest=execution["request_digest"],
            body=body,
        )
        await self.store.outbox.add_control(conn, topology.controls(execution["route"]), control)
        await conn.execute(
            "UPDATE turns SET waiting_for = $2 WHERE id = $1",
            turn.id,
            f"call {execution['call_id']} ({execution['tool']}), given its input",
        )
        return True
