"""A submit a Brain serves starts the turn's run in the submit's own commit when the turn can start
at once, on both backends; and whatever order racing submits commit in, one thread's turns never
run side by side: a queued turn never overtakes a started one. A submit and a close of its thread
or session, whichever commits first, are seen by the other: no turn lands in a closed thread."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from brain import verbs
from brain.rules import moves
from brain.rules.states import TurnPhase, TurnStatus
from brain.rules.submits import Start, Submit, Submitted
from brain.run.claims import Served
from brain.run.runs import Scheduler, Wakeups
from brain.store import BrainStore
from infra.transport import Topology
from infra.transport.localqueue import LocalBroker
from protocol import IllegalTransitionError
from tests.test_brain_claims import BINDING, _context
from tests.test_brain_store import AGENT, _agent, _claim, _facts, _move, _submit, _turn, pg_store, store

__all__ = ["pg_store", "store"]  # the fixtures, used by name

BINDINGS = {"echo": {"name": "echo"}}


def _asked(request_id: str, session: str = "s1", thread: str = "main") -> Submit:
    return Submit(
        namespace="ns", session_id=session, request_id=request_id, user_input=f"input {request_id}",
        agent=AGENT, wake_channel="wake", thread=thread,
    )  # fmt: skip


async def _served(
    store: BrainStore,
    request_id: str,
    bindings: Any = BINDINGS,
    owner: str = "b1",
    session: str = "s1",
    hold: float = 0.0,
) -> Submitted:
    """A served submit as ``brain.run.claims.Served`` makes it, offering to start the turn (a new
    thread freezes ``bindings``; an existing one must have its own). ``hold``: seconds its
    transaction stays open after the submit (the submit then runs inside a transaction, as one
    that another submit waits for)."""
    asked, start = _asked(request_id, session), Start(owner, 30.0, bindings)
    if not hold:
        return await store.submits.submit_served(asked, start)

    async def work(conn: Any) -> Submitted:
        await store.submits.lock_thread(conn, asked.thread_id)
        done = await store.submits.submit_in(conn, asked, start)
        await asyncio.sleep(hold)
        return done

    return await store.transact(work, read_then_insert=True)


async def _finish(store: BrainStore, turn_id: str) -> None:
    row = await _turn(store, turn_id)
    if row.phase is TurnPhase.PREPARE:
        row = (await _move(store, moves.prepare(row, freeze=None))).row
    await _move(store, moves.reply(row, {"text": "done"}, {}, intents=None, first_look=60.0))


async def test_a_served_submit_of_a_new_thread_starts_its_turn_in_one_commit_and_one_entry(store):
    done = await _served(store, "r1")
    row = done.started
    assert row is not None and done.created and row.id == done.turn_id
    assert (row.status, row.phase, row.lease_owner, row.lease_epoch, row.runs) == (
        TurnStatus.RUNNING, TurnPhase.MODEL_REQUEST, "b1", 1, 1,
    )  # fmt: skip
    # one journal entry: accepted, the run it began and the input prepared (a claim's facts)
    assert await _facts(store) == [(1, ["turn.accepted", "turn.run_started", "turn.prepared"])]
    assert done.seq == 1 and [f["kind"] for f in done.facts] == [
        "turn.accepted", "turn.run_started", "turn.prepared",
    ]  # fmt: skip
    thread = await store.read(lambda c: store.bindings.thread(c, "ns/s1"))
    assert thread["bindings"] == BINDINGS
    # it is this Brain's: no other claims it while the lease lives
    assert (await _claim(store, "b2", limit=5)).rows == []
    # and the same request id again answers the same turn, starting nothing
    again = await _served(store, "r1")
    assert (again.turn_id, again.created, again.started) == (done.turn_id, False, None)


async def test_a_served_submit_leaves_the_turn_queued_when_it_cannot_start_at_once(store):
    # A thread with an unfinished turn: the next one waits its turn
    first = await _submit(store, "r1")
    second = await _served(store, "r2")
    assert second.started is None and second.created
    assert (await _turn(store, second.turn_id)).status is TurnStatus.QUEUED
    # A new thread whose tools are not all announced: a claim's prepare waits for them, not the submit
    other = await _served(store, "r3", bindings=None, session="s2")
    assert other.started is None and (await _turn(store, other.turn_id)).status is TurnStatus.QUEUED
    assert await store.read(lambda c: store.bindings.thread(c, "ns/s2")) is not None
    # The queued ones are claimed in thread order
    claimed = (await _claim(store, "b1", limit=5)).rows
    assert {r.id for r in claimed} == {first, other.turn_id}


async def test_a_served_submit_to_an_idle_thread_with_frozen_bindings_starts_it(store):
    first = await _served(store, "r1")
    await _finish(store, first.turn_id)
    second = await _served(store, "r2")
    assert second.started is not None and second.started.phase is TurnPhase.MODEL_REQUEST
    assert second.seq == 3  # after the first turn's two entries; its history is read, not assumed


async def test_a_queued_turn_never_overtakes_a_started_one_of_its_thread(store):
    # Given the state two racing submits can leave: the later turn (by seq) started, the earlier
    # one queued (it committed after the other had started), and the started one's owner gone
    earlier = await _submit(store, "r1")
    later = await _submit(store, "r2")
    await store.transact(
        lambda c: c.execute(
            "UPDATE turns SET status = 'running', runs = 1, lease_epoch = 1 WHERE id = $1", later
        )
    )
    # When Brains claim, the started turn goes on and the queued one waits for it
    (row,) = (await _claim(store, "b1", limit=5)).rows
    assert row.id == later
    assert (await _claim(store, "b2", limit=5)).rows == []
    # and once it ended, the queued one is claimed
    await _finish(store, later)
    (row,) = (await _claim(store, "b2", limit=5)).rows
    assert row.id == earlier


async def test_racing_served_submits_to_one_idle_thread_start_one_turn(pg_store):
    store = pg_store
    first = await _served(store, "r0")
    await _finish(store, first.turn_id)
    # the first holds its transaction open while the others find the thread as it was before it
    holding = asyncio.create_task(_served(store, "r1", owner="b1", hold=0.5))
    await asyncio.sleep(0.2)
    done = await asyncio.gather(holding, *(_served(store, f"r{i}", owner=f"b{i}") for i in range(2, 7)))
    started = [d for d in done if d.started is not None]
    assert len(started) == 1, [(d.turn_id, d.started) for d in done]
    statuses = {d.turn_id: (await _turn(store, d.turn_id)).status for d in done}
    assert sorted(statuses.values()) == sorted([TurnStatus.RUNNING] + [TurnStatus.QUEUED] * 5)


@pytest.mark.parametrize("closing", ["thread", "session"])
async def test_a_close_that_waited_for_a_served_submit_sees_the_turn_it_started(pg_store, closing):
    store = pg_store
    first = await _served(store, "r0")
    await _finish(store, first.turn_id)
    # A served submit holds the thread (and the session's row) while a close of either waits
    holding = asyncio.create_task(_served(store, "r1", hold=0.5))
    await asyncio.sleep(0.2)

    async def close(conn: Any) -> bool:
        if closing == "thread":
            return await store.sessions.close_thread(conn, "ns/s1", "thread 'main'")
        return await store.sessions.close_session(conn, "ns/s1", "session 's1'")

    # Then the close, counting after the lock, finds the turn that submit started, and refuses
    with pytest.raises(IllegalTransitionError, match="1 unfinished turn"):
        await store.transact(close)
    assert (await holding).started is not None


@pytest.mark.parametrize(
    ("closing", "thread", "served"),
    [("thread", "main", False), ("thread", "main", True), ("session", "main", False),
     ("session", "main", True), ("session", "side", False), ("session", "side", True)],
)  # fmt: skip
async def test_a_submit_that_waited_for_a_close_finds_it_closed_and_adds_no_turn(
    pg_store, closing, thread, served
):
    store = pg_store
    first = await _served(store, "r0")
    await _finish(store, first.turn_id)
    # A close holds its locks, its count of unfinished turns made (none), when a submit comes
    conn = await store.pool.acquire()
    try:
        closing_tx = conn.transaction()
        await closing_tx.start()
        if closing == "thread":
            assert await store.sessions.close_thread(conn, "ns/s1", "thread 'main'")
        else:
            assert await store.sessions.close_session(conn, "ns/s1", "session 's1'")
        asked = _asked("r1", thread=thread)
        submitting = asyncio.create_task(
            store.submits.submit_served(asked, Start("b1", 30.0, BINDINGS))
            if served
            else store.submits.submit(asked)
        )
        await asyncio.sleep(0.3)
        assert not submitting.done(), "the submit went ahead of the close it should wait for"
        await closing_tx.commit()
    finally:
        await store.pool.release(conn)
    # Then the submit reads the thread or session as the close left it, and is refused
    with pytest.raises(IllegalTransitionError, match="is closed"):
        await submitting
    turns = await store.read(lambda c: c.fetch("SELECT id FROM turns WHERE session_id = 'ns/s1'"))
    assert [r["id"] for r in turns] == [first.turn_id]


async def test_a_served_submit_through_verbs_validates_like_any_submit(store):
    asked: list[Submit] = []

    async def served(submit: Submit) -> tuple[str, bool]:
        asked.append(submit)
        return await store.submits.submit(submit)

    turn_id, created = await verbs.submit(
        store, namespace="ns", session_id="s1", request_id="r1", user_input="hi", agent=AGENT,
        wake_channel="wake", thread="side", served=served,
    )  # fmt: skip
    assert created and [(a.thread_id, a.input_digest) for a in asked] == [
        ("ns/s1/side", asked[0].input_digest)
    ]
    assert (await _turn(store, turn_id)).status is TurnStatus.QUEUED


def test_a_brain_starts_turns_at_submit_only_while_few_runs_are_in_progress():
    scheduler = Scheduler(None, capacity=32, wakeups=Wakeups(), interval=1.0)  # type: ignore[arg-type]
    assert scheduler.quiet()
    scheduler.tasks = {f"t{i}": None for i in range(7)}  # type: ignore[misc]
    assert scheduler.quiet()
    scheduler.tasks["t7"] = None  # type: ignore[assignment]
    assert not scheduler.quiet()  # a quarter of the capacity: claims batch better from here
    scheduler.tasks.clear()
    scheduler.close()
    assert not scheduler.quiet()  # a stopping Brain starts nothing
    assert Scheduler(None, capacity=1, wakeups=Wakeups(), interval=1.0).quiet()  # type: ignore[arg-type]


async def test_the_bindings_a_served_submit_offers_are_frozen_only_by_a_thread_it_makes(store):
    # A new thread freezes the offered bindings, and says so (the Brain keeps them)
    first = await _served(store, "r1")
    assert first.froze == BINDINGS
    await _finish(store, first.turn_id)
    # An existing thread keeps its own: other bindings offered (announced since) change nothing
    second = await _served(store, "r2", bindings={"echo": {"name": "echo", "version": "2"}})
    assert second.started is not None and second.froze is None
    assert (await store.read(lambda c: store.bindings.thread(c, "ns/s1")))["bindings"] == BINDINGS
    # A new thread offered none (a tool nobody announced yet) queues its turn, frozen by no one
    other = await _served(store, "r3", bindings=None, session="s2")
    assert (other.started, other.froze) == (None, None)
    assert (await store.read(lambda c: store.bindings.thread(c, "ns/s2")))["bindings"] is None


async def test_served_submits_reuse_the_bindings_they_chose_until_the_announcements_change(
    store: BrainStore, tmp_path: Any
) -> None:
    # Given a pool that announced version 1 of a tool, and a Brain serving submits of new sessions
    await store.transact(lambda c: store.bindings.store_bindings(c, [BINDING], "wake"))
    agent = _agent(tools=["lab_tool"])
    reads: list[Any] = []
    marked = store.bindings.marked_bindings

    async def spy(conn: Any, tools: Any) -> Any:
        reads.append(tools)
        return await marked(conn, tools)

    store.bindings.marked_bindings = spy  # type: ignore[method-assign]

    def asked(session: str) -> Submit:
        return Submit(namespace="ns", session_id=session, request_id="r", user_input="hi", agent=agent,
                      wake_channel="wake")  # fmt: skip

    async def frozen(session: str) -> Any:
        return (await store.read(lambda c: store.bindings.thread(c, f"ns/{session}")))["bindings"]

    async with LocalBroker(tmp_path / "queues.sqlite3", Topology("t")) as transport:
        served = Served(_context(store, transport), quiet=lambda: True, adopt=lambda row: None)
        # When two new threads start: the announcements are read for the first only
        first, _ = await served.submit(asked("s1"))
        second, _ = await served.submit(asked("s2"))
        assert len(reads) == 1
        for session, turn in (("s1", first), ("s2", second)):
            assert (await _turn(store, turn)).status is TurnStatus.RUNNING
            assert (await frozen(session))["lab_tool"]["version"] == "1"

        # When the pool then announces version 2: the next new thread does not freeze what was
        # chosen before it (its turn is queued: its claim chooses), and the one after reads again
        v2 = BINDING.model_copy(update={"version": "2", "digest": "2" * 64})
        await store.transact(lambda c: store.bindings.store_bindings(c, [v2], "wake"))
        third, _ = await served.submit(asked("s3"))
        assert (await _turn(store, third)).status is TurnStatus.QUEUED and await frozen("s3") is None
        fourth, _ = await served.submit(asked("s4"))
        assert len(reads) == 2
        assert (await _turn(store, fourth)).status is TurnStatus.RUNNING
        assert (await frozen("s4"))["lab_tool"]["version"] == "2"
