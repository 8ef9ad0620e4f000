"""What a claim reads for the new turns it prepares (their threads and the announced bindings)
and for the runs it starts (their steps, threads and conversations), once for the whole claim,
not once per turn.

A claim that finds a turn's tools unannounced parks the turn as a row until an announcement
wakes it. An announcement that commits while the claim's transaction is open (after its look at
the bindings, before its commit) wakes nobody, because the turn does not wait yet; the Brain then
looks again once the turn waits, instead of letting it sit out its whole binding wait. That race
is PostgreSQL only: the embedded store takes its write lock for the whole claim, so there an
announcement cannot commit in between (it waits, then wakes the waiting turn itself)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from brain import verbs
from brain.rules.states import TurnPhase
from brain.run.claims import claim_turns
from brain.run.context import BrainContext
from brain.run.history import HistoryCache
from brain.run.relay import CommandRelay, ControlRelay
from brain.store import BrainStore, ClaimBudget
from brain.store.part import Part
from infra.objects.payloads import PayloadCodec
from infra.process.killpoints import KillPoints
from infra.transport import Topology
from infra.transport.localqueue import LocalBroker
from protocol import ReplayPolicy, ToolBinding
from tests.test_brain_store import _agent, _apply, _events, _submit, _waiting_on, pg_store, store

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
    await store.transact(lambda c: store.bindings.store_bindings(c, [BINDING], "wake"))
    agents = [_agent(tools=["lab_tool"])] * 3 + [_agent(name="other", tools=["nobody_serves"])]
    for n, agent in enumerate(agents):
        await verbs.submit(
            store, namespace="ns", session_id=f"s{n}", request_id="r", user_input="hi", agent=agent,
            wake_channel="wake", expect_tools=True,
        )  # fmt: skip
    reads: dict[str, list[Any]] = {"thread": [], "threads": [], "latest_bindings": []}
    originals = {name: getattr(store.bindings, name) for name in reads}
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
        setattr(store.bindings, name, spy(name))
    try:
        async with LocalBroker(tmp_path / "queues.sqlite3", Topology("t")) as transport:
            claim = await claim_turns(_context(store, transport), 10)
    finally:
        for name in reads:
            delattr(store.bindings, name)

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
        agent=_agent(tools=["lab_tool"]), wake_channel="wake", expect_tools=True,
    )  # fmt: skip
    async with LocalBroker(tmp_path / "queues.sqlite3", Topology("t")) as transport:
        ctx = _context(store, transport)
        looked = store.bindings.latest_bindings

        async def announced_meanwhile(conn: Any, tools: Any) -> dict[str, Any]:
            found = await looked(conn, tools)
            if not found:  # the pool announces on its own connection, the claim still open
                await store.transact(lambda c: store.bindings.store_bindings(c, [BINDING], "wake"))
            return found

        store.bindings.latest_bindings = announced_meanwhile  # type: ignore[method-assign]
        try:
            first = await claim_turns(ctx, 1)
        finally:
            del store.bindings.latest_bindings  # type: ignore[method-assign]
        (_, waited), = first.moved  # fmt: skip
        assert waited.row.phase is TurnPhase.PREPARE and waited.row.waiting_for is not None

        # Looked at again: the turn is due now, not in a minute, and the next claim goes on
        row = await store.pool.fetchrow(
            "SELECT status, waiting_for, wake_at <= now() AS due FROM turns WHERE id = $1", turn_id
        )
        assert (row["status"], row["waiting_for"], row["due"]) == ("running", None, True)
        second = await claim_turns(ctx, 1)
        assert [r.phase for r in second.runs] == [TurnPhase.MODEL_REQUEST]


class Outermost:
    """The store's reads a piece of code asks for, by name: a backend's batched read that loops
    over a single one (the portable base) counts once, as what was asked."""

    def __init__(self, store: BrainStore, *names: str) -> None:
        self.names, self.asked = names, []
        self._inside = False
        # Each read is a method of one of the store's parts (``journal.entries``...).
        parts = [p for p in vars(store).values() if isinstance(p, Part)]
        self.owners = {name: next(p for p in parts if hasattr(p, name)) for name in names}
        for name, owner in self.owners.items():
            setattr(owner, name, self._spy(name, getattr(owner, name)))

    def _spy(self, name: str, original: Any) -> Any:
        async def read(*args: Any, **kwargs: Any) -> Any:
            if self._inside:
                return await original(*args, **kwargs)
            self.asked.append(name)
            self._inside = True
            try:
                return await original(*args, **kwargs)
            finally:
                self._inside = False

        return read

    def __enter__(self) -> Outermost:
        return self

    def __exit__(self, *_: Any) -> None:
        for name, owner in self.owners.items():
            delattr(owner, name)


async def test_a_claim_of_turns_back_from_their_tools_reads_their_steps_and_conversations_once_for_all(
    store: BrainStore, tmp_path: Any
) -> None:
    # Given three sessions whose turns each waited on a tool, the outcomes applied (the turns
    # woken, none claimed), and a Brain that keeps nothing of their conversations
    for n in range(3):
        await _waiting_on(store, await _submit(store, session=f"s{n}"), f"e{n}", freeze={})
    for n in range(3):
        await _apply(store, [e.model_copy(update={"session_id": f"s{n}"}) for e in _events(f"e{n}", n)])
    names = ("step_executions", "steps_executions", "entries", "sessions_entries", "executions_by_id")
    async with LocalBroker(tmp_path / "queues.sqlite3", Topology("t")) as transport:
        ctx = _context(store, transport)
        with Outermost(store, *names, "thread", "threads") as reads:
            claim = await claim_turns(ctx, 10)

    # Then one read of their steps, one of their threads and one of their sessions' journals
    # served the whole claim (the executions the results name were in the steps read)
    assert sorted(reads.asked) == ["sessions_entries", "steps_executions", "threads"]
    # And each run's model call has what it needs without a read, the same as a read gives
    assert [r.phase for r in claim.runs] == [TurnPhase.MODEL_REQUEST] * 3
    for row in claim.runs:
        assert ctx.threads.known(row.thread_id) is not None
        fresh = await store.read(lambda c, row=row: HistoryCache(store).messages(c, row))
        assert ctx.history.cached(row) == fresh
        assert [m.role for m in fresh] == ["user", "assistant", "tool"]
        assert fresh[-1].content["result"] == int(row.session_id.removeprefix("ns/s"))


async def test_a_conversation_that_moved_meanwhile_is_read_again_not_kept_from_the_claim(
    store: BrainStore, tmp_path: Any
) -> None:
    # Given a turn back from its tool, and a claim that read its conversation ahead
    await _waiting_on(store, await _submit(store), "e1")
    await _apply(store, list(_events("e1", "done")))
    async with LocalBroker(tmp_path / "queues.sqlite3", Topology("t")) as transport:
        ctx = _context(store, transport)
        claim = await store.transact(lambda c: store.turns.claim(c, ctx.owner, 30.0, 1))
        (row,) = claim.rows
        read = await store.read(lambda c: ctx.history.read_ahead(c, [row], {}, {}))
        # When this process's cached history of the thread moves on before the read is kept
        await store.read(lambda c: ctx.history.messages(c, row))
        ctx.history.keep(read, [replace(row, revision=row.revision + 1)])
    # Then it is not taken as complete for the later revision (the next model call reads)
    assert ctx.history.cached(replace(row, revision=row.revision + 1)) is None
    assert ctx.history.cached(row) is not None


async def test_a_conversation_far_behind_is_left_to_its_run_not_read_inside_the_claim(
    store: BrainStore, tmp_path: Any
) -> None:
    # Given a turn back from its tool, and a Brain that keeps nothing of it and reads ahead only
    # conversations at most one entry behind (a long session, in small)
    await _waiting_on(store, await _submit(store), "e1", freeze={})
    await _apply(store, list(_events("e1", "done")))
    async with LocalBroker(tmp_path / "queues.sqlite3", Topology("t")) as transport:
        ctx = _context(store, transport)
        ctx.history.read_ahead_entries = 1
        with Outermost(store, "entries", "sessions_entries") as reads:
            claim = await claim_turns(ctx, 10)
    # Then the claim's transaction did not read its journal: its run will, outside any transaction
    (row,) = claim.runs
    assert reads.asked == [] and ctx.history.cached(row) is None


async def test_a_read_ahead_keeps_no_entry_after_the_one_its_transaction_wrote(store: BrainStore) -> None:
    # Given a turn back from its tool whose apply wrote entry ``upto``, and a later entry of its
    # session (another turn submitted) committed before the conversation is read
    await _waiting_on(store, await _submit(store), "e1", freeze={})
    applied = await _apply(store, list(_events("e1", "done")), budget=ClaimBudget("me", 30.0, 1))
    (row,) = applied.claimed
    upto, _ = applied.entries[row.id]
    await _submit(store, request_id="r2", text="later")
    history = HistoryCache(store)
    # When the conversation is read ahead up to that entry
    read = await store.read(lambda c: history.read_ahead(c, [row], applied.outcomes, {row.id: upto}))
    # Then it ends there, as a read inside the apply's transaction would have
    assert [e.seq for e in read.entries[row.session_id]] == list(range(1, upto + 1))
    # And without a bound it does not
    unbounded = await store.read(lambda c: history.read_ahead(c, [row], applied.outcomes, {}))
    assert unbounded.entries[row.session_id][-1].seq == upto + 1
