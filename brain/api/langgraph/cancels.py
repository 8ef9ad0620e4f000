"""Cancelling a run: its turn's cancel control (``/v1/turns/{id}/controls``), an explicit one
(invariant 13); ``rollback`` also takes the turn's messages out of the thread's conversation, as a
rollback by a new message does (``brain.verbs.doubletext``); a delayed run's schedule is deleted."""

from __future__ import annotations

from typing import Any

from brain.api.app import Api
from brain.api.langgraph.runflow import Run
from brain.rules import facts
from brain.rules.controls import Kind
from brain.rules.states import TERMINAL_TURN
from brain.verbs import controls
from brain.verbs import schedules as schedule_verbs
from infra.db import Connection
from protocol import IllegalTransitionError, NotFoundError, SchemaError, digest


async def cancel(api: Api, namespace: str, run: Run, action: str) -> None:
    """Cancel a run's turn (an explicit cancel: invariant 13); ``rollback`` also takes its messages
    out of the thread's conversation, as a rollback by a new message does."""
    if action not in ("interrupt", "rollback"):
        raise SchemaError("a cancel's action is interrupt or rollback")
    if run.turn_id is None:
        if run.schedule_id is not None:
            await schedule_verbs.change(
                api.store, namespace=namespace, schedule_id=run.schedule_id, action="delete"
            )
            return
        raise NotFoundError(f"run {run.run_id} has no turn to cancel")
    if action == "interrupt":
        await controls.control(
            api.store, namespace=namespace, turn_id=run.turn_id, request_id=f"lg-cancel:{run.run_id}",
            kind=Kind.CANCEL, topology=api.topology, wake_channel=api.wake_channel, ended=api.ended,
            send=api.controls,
        )  # fmt: skip
        return
    await _rollback(api, namespace, run)


async def _rollback(api: Api, namespace: str, run: Run) -> None:
    """A cancel that also journals ``turn.rolled_back`` on the turn, in the cancel's commit."""
    assert run.turn_id is not None
    store, turn_id, request_id = api.store, run.turn_id, f"lg-rollback:{run.run_id}"
    body = {"strategy": "rollback", "by": f"run {run.run_id}"}
    input_digest = digest({"kind": "cancel", **body})
    queued: list[Any] = []
    ended: list[Any] = []

    async def work(conn: Connection) -> None:
        queued.clear()
        ended.clear()
        turn, earlier = await controls.locked_turn(store, conn, namespace, turn_id, request_id, input_digest)
        if earlier is not None:
            return
        if turn.status in TERMINAL_TURN:
            raise IllegalTransitionError(
                f"run {run.run_id} ended already ({turn.status}): nothing to roll back"
            )
        receipt = await controls.record(
            store, conn, turn, Kind.CANCEL, body, request_id, input_digest, api.topology, api.wake_channel,
            queued, why=f"rolled back by a cancel of run {run.run_id}", note=[facts.rolled_back(run.run_id)],
        )  # fmt: skip
        if receipt.status == "applied":
            ended.append(turn)

    await store.transact(work)
    for turn in ended:
        api.ended(turn.id, "cancelled", turn.created_at)
    if queued and api.controls is not None:
        api.controls(list(queued))
