"""What a claim reads for the new turns it prepares: their threads and the announced bindings,
once for the whole claim, not once per turn.

A claim that finds a turn's tools unannounced parks the turn as a row until an announcement
wakes it. An announcement that commits while the claim's transaction is open (after its look at
the bindings, before its commit) wakes nobody, because the turn does not wait yet; the Brain then
looks again once the turn waits, instead of letting it sit out its whole binding wait. That race
is PostgreSQL only: the embedded store takes its write lock for the whole claim, so there an
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
from tests.test_brain_store import _agent, pg_store, store

__all__ = ["pg_store", "store"]  # the fixtures, used by name

BINDING = ToolBinding.build(
    name="lab_tool",
    version="1",
    route="lab",
    input_schema={"type": "object"},
    replay_policy=ReplayPolicy.SAFE,
)


def _context(store: BrainStore, transport: Any) -> BrainContext:
    return BrainContext(
        store=store, codec=PayloadCodec(None, 1 << 20), topology=Topology("t"),
        killpoints=KillPoints(), commands=CommandRelay(transport),
        controls=ControlRelay(store, transport, interval=1.0), owner="brain-claims", wake_channel="wake",
        lease_seconds=30.0, binding_wait_seconds=60.0, first_look=1.0,
    )  # fmt: skip


async def test_a_claim_of_new_turns_reads_their_threads_and_the_announced_bindings_once_for_all(
    store: BrainStore, tmp_path: Any
) -> None:
    # Given three new sessions whose agent's tool is announced, and one whose tool is not
    await store.transact(lambda c: store.store_bindings(c, [BINDING], "wake"))
    agents = [_agent(tools=["lab_tool"])] * 3 + [_agent(name="other", tools=["nobody_serves"])]
    for n, agent in enumerate(agents):
        await verbs.submit(
            store, namespace="ns", session_id=f"s{n}", request_id="r", user_input="hi", agent=agent,
            wake_channel="wake",
        )  # fmt: skip
    reads: dict[str, list[Any]] = {"thread": [], "threads": [], "latest_bindings": []}
    originals = {name: getattr(store, name) for name in reads}
    inside = False

    def spy(name: str) -> Any:
        async def read(conn: Any, keys: Any) -> Any:
            nonlocal inside
            if inside:  # a backend's ``threads`` may read them one by one: that is one call
                return await originals[name](conn, keys)
            reads[name].append(keys)
            inside = name == "threads"
            try:
                return await originals[name](conn, keys)
            finally:
                inside = False

        return read

    for name in reads:
        setattr(store, name, spy(name))
    try:
        async with LocalBroker(tmp_path / "queues.sqlite3", Topology("t")) as transport:
            claim = await claim_turns(_context(store, transport), 10)
    finally:
        for name in reads:
            delattr(store, name)

    # Then one read of the four threads and one of the bindings served the whole claim (the
    # turn left waiting has its thread and tools looked at once more after the commit)
    assert len(reads["threads"]) == 1 and len(set(reads["threads"][0])) == 4
    looks = [sorted(tools) for tools in reads["latest_bindings"]]
    assert looks == [["lab_tool", "nobody_serves"], ["nobody_serves"]]
    # And each turn went where a look of its own would have taken it: the three froze the
    # announced binding and call the model; the fourth waits for its tool
    assert [r.phase for r in claim.runs] == [TurnPhase.MODEL_REQUEST] * 3
    frozen = await store.read(lambda c: c.fetch("SELECT bindings FROM threads ORDER BY id"))
    bindings = [r["bindings"] for r in frozen]
    assert bindings.count(None) == 1
    assert all(b == {"lab_tool": BINDING.model_dump(mode="json")} for b in bindings if b is not None)
    (waiting,) = [m.row for _, m in claim.moved if m.row.waiting_for is not None]
    assert waiting.phase is TurnPhase.PREPARE and reads["thread"] == [waiting.thread_id]


async def test_tools_announced_while_a_claim_looks_for_them_wake_the_turn_at_once(
    pg_store: BrainStore, tmp_path: Any
) -> None:
    store = pg_store
    turn_id, _ = await verbs.submit(
        store, namespace="ns", session_id="s1", request_id="r1", user_input="hi",
        agent=_agent(tools=["lab_tool"]), wake_channel="wake",
    )  # fmt: skip
    async with LocalBroker(tmp_path / "queues.sqlite3", Topology("t")) as transport:
        ctx = _context(store, transport)
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
