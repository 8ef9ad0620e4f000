"""Signals: what wakes a turn's built-in ``wait_for_signal`` call (``brain.rules.waits``). One place
for `brain signal TURN KEY JSON` and ``POST /v1/turns/ID/signals``.

A signal is a control like the others (invariant 12): recorded with a receipt, idempotent by its
request id per turn (the same id and input answer the original receipt; another input is a
CONFLICT), journaled. In the same commit it answers the turn's call that waits for its key: that
call succeeds with the signal's payload as its result (the receipt is ``applied``), and the turn
goes on. A signal that no call waits for yet is kept (``received``): the repair scan answers the
first call of the turn that waits for its key with it, and rejects it if the turn ends first. A
signal to a turn that ended is rejected.
"""

from __future__ import annotations

from typing import Any

from brain.rules import facts
from brain.rules.names import MAX_REQUEST_ID, check_id
from brain.rules.states import TERMINAL_TURN
from brain.rules.waits import signal_refusal
from brain.store import BrainStore
from brain.verbs.controls import Receipt, locked_turn
from infra.db import Connection
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
    check_id("request id", request_id, MAX_REQUEST_ID)
    if unstorable(payload) is not None:
        raise SchemaError(f"the signal's payload cannot be stored: its text {unstorable(payload)}")
    body = {"key": key, "payload": payload}
    input_digest = digest({"kind": "signal", **body})

    async def work(conn: Connection) -> Receipt:
        turn, earlier = await locked_turn(store, conn, namespace, turn_id, request_id, input_digest)
        if earlier is not None:
            return earlier
        waiter, why = None, None
        if turn.status in TERMINAL_TURN:
            why = f"the turn is {turn.status} already"
        else:
            waiter = await store.waits.waiting_for_signal(conn, turn_id, key)
        # No call waits for it now: kept (received) for the first that will, until the turn ends.
        status = "rejected" if why else ("applied" if waiter is not None else "received")
        row = await store.controls.record_control(
            conn, turn_id, request_id, "signal", input_digest, body, status, why
        )
        said = [facts.control(row["id"], "signal", status, why)]
        if waiter is not None:
            said.append(await store.waits.signalled(conn, waiter, row["id"], body, wake_channel))
        await store.journal.append(
            conn, turn.session_id, turn_id, said, thread_id=turn.thread_id,
            status=await store.turns.status_of(conn, turn_id), phase=str(turn.phase),
        )  # fmt: skip
        return Receipt.of(row)

    return await store.transact(work)
