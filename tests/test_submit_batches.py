"""Submits that share a commit, on both backends: each submit of a batch has its own outcome (a
new turn, started or queued; the turn its request id already has; its own refusal), a session's
second submit in a batch sees the first's turn, and a Brain's concurrent submits share
transactions while each caller hears its own answer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest

from brain.rules import moves
from brain.rules.states import TurnStatus
from brain.rules.submits import Start, Submit, Submitted
from brain.run.claims import Served
from brain.store import BrainStore, ClaimBudget
from infra.transport import Topology
from infra.transport.localqueue import LocalBroker
from protocol import ConflictError, IllegalTransitionError
from tests.test_brain_claims import _context
from tests.test_brain_store import AGENT, _agent, _events, _intent, _move, _turn, pg_store, store
from tests.test_served_submit import BINDINGS, _finish, _served

__all__ = ["pg_store", "store"]  # the fixtures, used by name


def _asked(session: str, request_id: str = "r1", text: str | None = None) -> Submit:
    return Submit(
        namespace="ns", session_id=session, request_id=request_id,
        user_input=text or f"input {request_id}", agent=AGENT, wake_channel="wake",
    )  # fmt: skip


def _start() -> Start:
    return Start("b1", 30.0, BINDINGS)


async def _entries(store: BrainStore, session: str) -> list[tuple[int, str | None, list[str]]]:
    rows = await store.read(
        lambda c: c.fetch(
            "SELECT seq, turn_id, facts FROM journal WHERE session_id = $1 ORDER BY seq", f"ns/{session}"
        )
    )
    return [(r["seq"], r["turn_id"], [f["kind"] for f in r["facts"]]) for r in rows]


async def test_the_submits_of_one_batch_each_get_their_own_outcome(store: BrainStore) -> None:
    # Given a session with a turn, a session whose request r1 had another input, a closed session
    known = await _served(store, "r1", session="s-known")
    other = await _served(store, "r1", session="s-other")
    closed = await _served(store, "r1", session="s-closed")
    await _finish(store, closed.turn_id)
    assert await store.transact(lambda c: store.sessions.close_session(c, "ns/s-closed", "session"))

    # When one transaction takes their submits with new ones, two of them to one new session
    items: list[tuple[Submit, Start | None]] = [
        (_asked("s-new"), _start()),
        (_asked("s-queued"), None),
        (_asked("s-known"), _start()),
        (_asked("s-other", text="something else"), _start()),
        (_asked("s-closed", "r2"), _start()),
        (_asked("s-new", "r2"), _start()),
    ]

    async def work(conn: Any) -> list[Submitted | Exception]:
        return list(await store.submits.submit_batch(conn, items))

    new, queued, again, conflict, refused, second = await store.transact(work, read_then_insert=True)

    # Then each has its own: a new turn started at once, on a thread that froze the bindings
    assert isinstance(new, Submitted) and new.created and new.started is not None
    assert new.froze == BINDINGS and new.seq == 1
    assert (await _turn(store, new.turn_id)).status is TurnStatus.RUNNING
    # a plain submit's turn queued for a claim
    assert isinstance(queued, Submitted) and queued.created and queued.started is None
    assert (await _turn(store, queued.turn_id)).status is TurnStatus.QUEUED
    # the turn its request id already has, unchanged
    assert isinstance(again, Submitted) and (again.turn_id, again.created) == (known.turn_id, False)
    # its own refusals, which wrote nothing
    assert isinstance(conflict, ConflictError) and "different input" in str(conflict)
    assert isinstance(refused, IllegalTransitionError) and "is closed" in str(refused)
    for session, only in (("s-other", other), ("s-closed", closed)):
        turns = await store.read(
            lambda c, s=f"ns/{session}": c.fetch("SELECT id FROM turns WHERE session_id = $1", s)
        )
        assert [r["id"] for r in turns] == [only.turn_id]
        assert {e[1] for e in await _entries(store, session)} <= {only.turn_id, None}
    # and a session's second submit sees the first's turn: queued behind it, the next entry
    assert isinstance(second, Submitted) and second.created and second.started is None
    assert (await _turn(store, second.turn_id)).status is TurnStatus.QUEUED
    assert await _entries(store, "s-new") == [
        (1, new.turn_id, ["turn.accepted", "turn.run_started", "turn.prepared"]),
        (2, second.turn_id, ["turn.accepted"]),
    ]


async def test_a_new_agent_version_submitted_twice_in_one_batch_has_one_content(store: BrainStore) -> None:
    # Two submits of one batch register one new agent version: with the same content both make
    # their turns; with another, the later one is refused, as it would be one after the other.
    same, other = _agent(name="fresh"), _agent(name="fresh", model={"kind": "scripted", "script": []})
    assert same.digest != other.digest
    items: list[tuple[Submit, Start | None]] = [
        (replace(_asked(f"s{i}"), agent=agent), None) for i, agent in enumerate([same, same, other])
    ]
    first, second, third = await store.transact(
        lambda c: store.submits.submit_batch(c, items), read_then_insert=True
    )
    assert isinstance(first, Submitted) and isinstance(second, Submitted) and first.created and second.created
    assert isinstance(third, ConflictError) and "different content" in str(third)
    stored = await store.read(lambda c: c.fetch("SELECT digest FROM agents WHERE name = 'fresh'"))
    assert [r["digest"] for r in stored] == [same.digest]


async def test_a_brains_concurrent_submits_share_commits_and_each_hears_its_own_answer(
    store: BrainStore, tmp_path: Any
) -> None:
    # Given a Brain serving submits, one of them conflicting with a turn already there
    clash = await _served(store, "r1", session="s-clash")
    adopted: list[Any] = []
    async with LocalBroker(tmp_path / "queues.sqlite3", Topology("t")) as transport:
        served = Served(_context(store, transport), quiet=lambda: True, adopt=adopted.append)
        asked = [_asked(f"s{i}") for i in range(12)] + [_asked("s-clash", text="something else")]

        # When they all come at once
        answers = await asyncio.gather(*(served.submit(a) for a in asked), return_exceptions=True)

    # Then they shared transactions, and each caller got its own turn, or its own refusal
    assert served.submits.items == len(asked) and max(served.submits.sizes) > 1, served.submits.sizes
    *made, refused = answers
    assert isinstance(refused, ConflictError) and clash.turn_id in str(refused)
    assert all(isinstance(m, tuple) and m[1] for m in made), made
    turns = [m[0] for m in made if isinstance(m, tuple)]
    assert len(set(turns)) == len(turns)
    for i, turn_id in enumerate(turns):
        row = await _turn(store, turn_id)
        assert (row.session_id, row.status) == (f"ns/s{i}", TurnStatus.RUNNING)
    assert sorted(r.id for r in adopted) == sorted(turns)  # each run goes on here


async def test_racing_batches_of_the_same_sessions_in_opposite_orders_do_not_deadlock(pg_store):
    # Two batches, in two transactions at once, each submitting to sessions that exist, given in
    # opposite orders, while a third transaction holds a session in the middle (so that both
    # have locked some rows when they meet): rows are locked in one order (sessions, then
    # threads, by id), so both commit; a deadlock would fail one of them.
    store = pg_store
    sessions = [f"s{i}" for i in range(6)]
    for s in sessions:
        await _finish(store, (await _served(store, "r0", session=s)).turn_id)

    async def hold(conn: Any) -> None:
        await conn.execute("SELECT id FROM sessions WHERE id = 'ns/s3' FOR UPDATE")
        await asyncio.sleep(0.3)

    holding = asyncio.create_task(store.transact(hold))
    await asyncio.sleep(0.1)

    async def batch(order: list[str], tag: str) -> list[Any]:
        # A transaction of its own, not ``transact``, which would try a deadlocked one again
        async with store.pool.acquire() as conn, conn.transaction():
            return list(
                await store.submits.submit_batch(conn, [(_asked(s, f"r-{tag}"), _start()) for s in order])
            )

    forward, backward = await asyncio.wait_for(
        asyncio.gather(batch(sessions, "a"), batch(sessions[::-1], "b")), timeout=5
    )
    await holding
    # and of each session's two new turns one started, the other was queued behind it
    for s, a, b in zip(sessions, forward, reversed(backward), strict=True):
        assert a.created and b.created
        assert sorted([a.started is not None, b.started is not None]) == [False, True], s


async def _moves_ending(store: BrainStore, sessions: list[str]) -> Callable[[Any], Awaitable[Any]]:
    """A batch of moves that ends a running turn in each session (a journal entry each)."""
    rows = [await _turn(store, (await _served(store, "r0", session=s)).turn_id) for s in sessions]
    ending = [moves.reply(r, {"text": "done"}, {}, intents=None, first_look=60.0) for r in rows]
    return lambda conn: store.turns.commit_moves(conn, ending, 30.0)


async def _applies_waking(store: BrainStore, sessions: list[str]) -> Callable[[Any], Awaitable[Any]]:
    """A batch of applies that wakes a turn waiting on its tool in each session (a journal entry
    each)."""
    ranges = []
    for s in sessions:
        row = await _turn(store, (await _served(store, "r0", session=s)).turn_id)
        execution_id = f"exe-{s}"
        calls = [{"call_id": "call-1", "tool": "echo", "args": {}}]
        reply = moves.reply(
            row, {"text": None, "tool_calls": calls}, {}, intents=[_intent(execution_id)], first_look=60.0
        )
        await _move(store, reply)
        ranges.append(list(_events(execution_id, session=s)))
    # claimed by the apply, so that each wake-up is a journal entry (the run it starts)
    return lambda conn: store.events.apply_events(
        conn, ranges, wake_channel="ch", budget=ClaimBudget("b1", 30.0, 10)
    )


@pytest.mark.parametrize("batch", [_moves_ending, _applies_waking], ids=["moves", "applies"])
async def test_a_batch_of_journal_entries_and_one_of_submits_over_the_same_sessions_do_not_deadlock(
    pg_store, batch
):
    # A batch whose journal entries fall in six sessions, and a batch of submits to the six (it
    # locks sessions in id order). While a third transaction holds a session in the middle, the
    # submits wait there, holding the ones before it; the entries' batch bumps the sessions' seqs
    # in id order too, so it waits for the first and holds none the submits wait for, and both
    # commit. Walked in another order, it would hold a later one: a deadlock fails one of them.
    store = pg_store
    sessions = [f"s{i}" for i in range(6)]
    entries = await batch(store, sessions)
    held, release = asyncio.Event(), asyncio.Event()

    async def hold(conn: Any) -> None:
        await conn.execute("SELECT id FROM sessions WHERE id = 'ns/s3' FOR UPDATE")
        held.set()
        await release.wait()

    holding = asyncio.create_task(store.transact(hold))
    await held.wait()

    # Transactions of their own, not ``transact``, which would try a deadlocked one again
    async def submits() -> list[Any]:
        async with store.pool.acquire() as conn, conn.transaction():
            return list(
                await store.submits.submit_batch(conn, [(_asked(s, "r1"), _start()) for s in sessions])
            )

    async def journal() -> Any:
        async with store.pool.acquire() as conn, conn.transaction():
            return await entries(conn)

    try:
        submitting = asyncio.create_task(submits())
        await _waiting_for_sessions(store, 1)  # the submits hold the sessions before the middle one
        writing = asyncio.create_task(journal())
        await _waiting_for_sessions(store, 2)  # and the other batch waits too
    finally:
        release.set()
    submitted, _ = await asyncio.wait_for(asyncio.gather(submitting, writing), timeout=10)
    await holding
    assert all(isinstance(s, Submitted) and s.created for s in submitted)
    # each session's journal: the first turn's entries, the other batch's, then the new submit's
    for s in sessions:
        seqs = [seq for seq, _, _ in await _entries(store, s)]
        assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 3, s


async def _waiting_for_sessions(store: BrainStore, n: int) -> None:
    """Until ``n`` transactions wait for a session's row (each waiter holds a tuple lock on it;
    the first in line does, the others wait for that lock)."""
    for _ in range(1000):
        waiting = await store.read(
            lambda c: c.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'tuple' AND relation = 'sessions'::regclass"
            )
        )
        if waiting >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{n} transactions did not come to wait for a session")


@pytest.mark.parametrize("n", [1, 3])
async def test_a_batch_statement_writes_what_one_by_one_submits_write(pg_store, n):
    # The facts of a batch (rows of turns, threads, sessions, journal) are those of the same
    # submits committed one at a time, but for the ids they made.
    store = pg_store
    items = [(_asked(f"b{i}"), _start() if i % 2 else None) for i in range(n)]
    alone = [(_asked(f"a{i}"), _start() if i % 2 else None) for i in range(n)]
    await store.transact(lambda c: store.submits.submit_batch(c, items), read_then_insert=True)
    for s, start in alone:
        await store.transact(lambda c, s=s, start=start: store.submits.submit_batch(c, [(s, start)]))

    async def facts(prefix: str) -> list[Any]:
        rows = await store.read(
            lambda c: c.fetch(
                "SELECT t.status, t.phase, t.lease_owner, t.runs, th.bindings, j.seq, j.facts, s.last_seq"
                "  FROM turns t JOIN threads th ON th.id = t.thread_id JOIN sessions s ON s.id = t.session_id"
                "  JOIN journal j ON j.turn_id = t.id WHERE t.session_id LIKE $1 ORDER BY t.session_id",
                f"ns/{prefix}%",
            )
        )
        return [tuple(r.values()) for r in rows]

    assert await facts("b") == await facts("a")
