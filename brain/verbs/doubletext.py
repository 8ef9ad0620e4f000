"""A submit that interrupts or rolls back its thread's unfinished turns (``brain.rules.doubletext``
says what each strategy does): the new turn and a cancel of each turn ahead of it, in one commit.

Each cancel is a control on its turn like any other (a receipt, request id ``STRATEGY:NEW_TURN``,
done at once or once the calls a Hands worker accepted are settled); what it settles says why
(``interrupted by a new message (turn NEW_TURN)``), and that is what the model reads of those calls.
A rollback's cancel also journals ``turn.rolled_back`` on its turn.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from brain.rules import facts
from brain.rules.controls import Kind
from brain.rules.doubletext import Strategy, superseded_reason
from brain.rules.records import Control, TurnRow
from brain.rules.states import TurnStatus
from brain.rules.submits import Submit, Submitted
from brain.store import BrainStore
from brain.verbs.controls import record
from infra.db import Connection
from infra.transport import Topology
from protocol import digest


async def submit_superseding(
    store: BrainStore,
    submit: Submit,
    *,
    topology: Topology | None,
    ended: Callable[[str, str, datetime], None] | None = None,
    send: Callable[[list[Control]], object] | None = None,
) -> tuple[str, bool]:
    """Accept ``submit``'s turn (queued) and cancel the unfinished turns ahead of it in its thread,
    in one commit; returns (turn id, created now). A request id that made its turn already answers
    it and cancels nothing. ``ended`` and ``send``: as for ``brain.verbs.controls.control``."""
    assert topology is not None, "an interrupt or a rollback cancels turns: it needs the topology"
    ends: list[TurnRow] = []
    queued: list[Control] = []

    async def work(conn: Connection) -> Submitted:
        ends.clear()  # a transaction tried again starts over
        queued.clear()
        done = await store.submits.submit_in(conn, submit, None)
        if done.created:
            for turn in await store.turns.unfinished_of_thread(conn, submit.thread_id):
                if turn.id == done.turn_id:
                    continue
                if await _cancel(store, conn, turn, submit, done.turn_id, topology, queued):
                    ends.append(turn)
        return done

    done = await store.transact(work, read_then_insert=True)
    if ended is not None:
        for turn in ends:
            ended(turn.id, str(TurnStatus.CANCELLED), turn.created_at)
    if queued and send is not None:
        send(list(queued))
    return done.turn_id, done.created


async def _cancel(
    store: BrainStore, conn: Connection, turn: TurnRow, submit: Submit, by_turn: str, topology: Topology,
    queued: list[Control],
) -> bool:  # fmt: skip
    """Cancel ``turn`` for the new turn ``by_turn``; whether that ended it at once."""
    strategy = submit.strategy
    body = {"strategy": str(strategy), "by": by_turn}
    note = [facts.rolled_back(by_turn)] if strategy is Strategy.ROLLBACK else []
    receipt = await record(
        store, conn, turn, Kind.CANCEL, body, f"{strategy}:{by_turn}", digest({"kind": "cancel", **body}),
        topology, submit.wake_channel, queued, why=superseded_reason(strategy, by_turn), note=note,
    )  # fmt: skip
    return receipt.status == "applied"
