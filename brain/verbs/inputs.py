"""A person's answer to what a running execution asks (an MCP task in ``input_required``), as
`brain respond` gives it: ``result`` is the answer (any JSON: the Hands make of it what the
server asked for), ``deny`` declines. The answer is a control for the execution's Hands (through
the outbox, in the respond's commit); the execution runs on."""

from __future__ import annotations

from typing import Any

from brain.rules import facts
from brain.rules.records import TurnRow
from brain.store import BrainStore
from infra.db import Connection
from infra.transport import Topology
from protocol import InputBody

AWAITING = "awaiting_input"


def awaits_input(execution: Any) -> bool:
    return execution is not None and execution["how"] == AWAITING and execution["status"] == "running"


def refused(execution: Any, decision: str, topology: Topology | None) -> str | None:
    """Why an answer to an execution that asks for input cannot be taken (a pure rule), or None."""
    if decision == "approve":
        return f"call {execution['call_id']} asks for input: give it a result (or deny it), not an approval"
    if topology is None:
        return "this Brain cannot send an answer to a Hands pool (no broker topology)"
    return None


async def give(
    store: BrainStore, conn: Connection, turn: TurnRow, execution: Any, body: dict[str, Any],
    request_id: str, topology: Topology | None,
) -> dict[str, Any] | None:  # fmt: skip
    """Send the answer on; its fact (None: the execution stopped waiting meanwhile)."""
    assert topology is not None  # refused() said so otherwise
    question = await store.inputs.question(conn, execution["id"]) or {}
    answer = InputBody(
        key=str(question.get("key") or "input"),
        decision="answer" if body["decision"] == "result" else "decline", answer=body.get("result"),
        reason=body.get("reason"), request_id=request_id,
    )  # fmt: skip
    if not await store.inputs.give(conn, topology, turn, execution, answer):
        return None
    e = execution
    return facts.input_given(e["id"], e["call_id"], e["tool"], answer.key, answer.decision)
