"""Signals: what wakes a turn's built-in ``wait_for_signal`` call (``brain.rules.waits``). One place
for `brain signal TURN KEY JSON` and ``POST /v1/turns/ID/signals``.

A signal is a control like the others (invariant 12): recorded with a receipt, idempotent by its
request id per turn (the same id and input answer the original receipt; another input is a
CONFLICT), journaled. In the same commit it answers the turn's call that waits for its key: that
call succeeds with the signal's payload as its result, and the turn goes on. A signal that no call
waits for now is rejected, saying so: nothing keeps it for a later wait, so a sender whose signal
came too early sends it again (under a new request id) once the turn waits.
"""

from __future__ import annotations

from typing import Any

from brain.rules import facts
from brain.rules.states import TERMINAL_TURN
from brain.rules.waits import signal_refusal, signalled
from brain.store import BrainStore
from brain.verbs.controls import Receipt, locked_turn
from infra.db import Connection, Json
from protocol import SchemaError, digest
from protocol.storable import unstorable


async def signal(
    store: BrainStore,
    *,
    namespace: str,
    turn_id: str,
    request_id: str,
    key: str,
    payload: Any,
    wake_channel: str,
) -> Receipt:
    """Send signal ``key`` with ``payload`` (any JSON) to a turn; its receipt: ``applied`` when a
    call waited for it (it is answered now), else ``rejected`` with the reason."""
    why_not = signal_refusal(key)
    if why_not is not None:
        raise SchemaError(why_not)
    if unstorable(payload) is not None:
        raise SchemaError(f"the signal's payload cannot be stored: its text {unstorable(payload)}")
    body = {"key": key, "payload": payload}
    input_digest = digest({"kind": "signal", **body})

    async def work(conn: Connection) -> Receipt:
        turn, earlier = await locked_turn(store, conn, namespace, turn_id, request_id, input_digest)
        if earlier is not None:
            return earlier
        waiter = None
        if turn.status in TERMINAL_TURN:
            why: str | None = f"the turn is {turn.status} already"
        else:
            waiter = await store.waits.waiting_for_signal(conn, turn_id, key)
            why = None if waiter is not None else f"no call of turn {turn_id} waits for signal {key!r} now"
        status = "rejected" if why else "applied"
        row = await store.controls.record_control(
            conn, turn_id, request_id, "signal", input_digest, body, status, why
        )
        said = [facts.control(row["id"], "signal", status, why)]
        if waiter is not None:
            await store.controls.settle_by_hand(
                conn, waiter, status="succeeded", how="signalled", result=Json(signalled(key, payload)),
                error=None, evidence=f"signal {key} (control #{row['id']})", wake_channel=wake_channel,
            )  # fmt: skip
            said.append(
                facts.execution_event(
                    "succeeded", waiter["id"], waiter["call_id"], waiter["tool"], how="signalled"
                )
            )
        await store.journal.append(
            conn, turn.session_id, turn_id, said, thread_id=turn.thread_id,
            status=await store.turns.status_of(conn, turn_id), phase=str(turn.phase),
        )  # fmt: skip
        return Receipt.of(row)

    return await store.transact(work)
