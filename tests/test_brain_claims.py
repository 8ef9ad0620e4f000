"""A claim that finds a turn's tools unannounced parks the turn as a row until an announcement
wakes it. An announcement that commits while the claim's transaction is open (after its look at
the bindings, before its commit) wakes nobody, because the turn does not wait yet; the Brain then
looks again once the turn waits, instead of letting it sit out its whole binding wait.

PostgreSQL only: the embedded store takes its write lock for the whole claim, so there an
announcement cannot commit in between (it waits, then wakes the waiting turn itself)."""

from __future__ import annotations

from typing import Any

from brain import verbs
from brain.claims import claim_turns
from brain.context import BrainContext
from brain.relay import CommandRelay, ControlRelay
from brain.states import TurnPhase
from brain.store import BrainStore
from infra.killpoints import KillPoints
from infra.localqueue import LocalBroker
from infra.payloads import PayloadCodec
from infra.transport import Topology
from protocol import ReplayPolicy, ToolBinding
from tests.test_brain_store import _agent, pg_store

__all__ = ["pg_store"]  # the fixture, used by name

BINDING = ToolBinding.build(
    name="lab_tool",
    version="1",
    route="lab",
    input_schema={"type": "object"},
    replay_policy=ReplayPolicy.SAFE,
)


async def test_tools_announced_while_a_claim_looks_for_them_wake_the_turn_at_once(
    pg_store: BrainStore, tmp_path: Any
) -> None:
    store = pg_store
    turn_id, _ = await verbs.submit(
        store, namespace="ns", session_id="s1", request_id="r1", user_input="hi",
        agent=_agent(tools=["lab_tool"]), wake_channel="wake",
    )  # fmt: skip
    async with LocalBroker(tmp_path / "queues.sqlite3", Topology("t")) as transport:
        ctx = BrainContext(
            store=store, codec=PayloadCodec(None, 1 << 20), topology=Topology("t"),
            killpoints=KillPoints(), commands=CommandRelay(transport),
            controls=ControlRelay(store, transport, interval=1.0), owner="brain-claims", wake_channel="wake",
            lease_seconds=30.0, binding_wait_seconds=60.0, first_look=1.0,
        )  # fmt: skip
        looked = store.latest_bindings

        async def announced_meanwhile(conn: Any, tools: Any) -> dict[str, Any]:
            found = await looked(conn, tools)
            if not found:  # the pool announces on its own connection, the claim still open
                await store.transact(lambda c: store.store_bindings(c, [BINDING], "wake"))
            return found

        store.latest_bindings = announced_meanwhile  # type: ignore[method-assign]
        try:
            first = await claim_turns(ctx, 1)
        finally:
            del store.latest_bindings  # type: ignore[method-assign]
        (_, waited), = first.moved  # fmt: skip
        assert waited.row.phase is TurnPhase.PREPARE and waited.row.waiting_for is not None

        # Looked at again: the turn is due now, not in a minute, and the next claim goes on
        row = await store.pool.fetchrow(
            "SELECT status, waiting_for, wake_at <= now() AS due FROM turns WHERE id = $1", turn_id
        )
        assert (row["status"], row["waiting_for"], row["due"]) == ("running", None, True)
        second = await claim_turns(ctx, 1)
        assert [r.phase for r in second.runs] == [TurnPhase.MODEL_REQUEST]
