"""The conversation a Brain caches for a thread goes on from what its own commits wrote: a turn an
apply claimed reaches its next model call without reading the journal, and what it sees then is
what a read of the journal gives; when the apply cannot tell the whole of it (a sibling ended in
an earlier apply), the next model call reads; when this Brain keeps nothing of the turns an apply
claims, their conversations are read for all of them once the apply committed, while the next
apply goes on. Both backends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from brain.rules import moves
from brain.run.history import HistoryCache
from brain.run.runs import Scheduler, Wakeups
from brain.run.updates import UpdateConsumer
from brain.store import BrainStore, ClaimBudget, TurnRow
from infra.transport import Topology
from infra.transport.localqueue import LocalBroker
from tests.test_brain_claims import Outermost, _context
from tests.test_brain_store import _apply, _claim, _events, _intent, _move, _submit, _waiting_on, store

__all__ = ["store"]  # the fixture, used by name

CALLS = [{"call_id": "call-1", "tool": "echo", "args": {}}, {"call_id": "call-2", "tool": "echo", "args": {}}]


async def _waiting(store: BrainStore, history: HistoryCache) -> TurnRow:
    """A turn driven the way a run does it, the cache kept along: claimed and prepared, its
    history read for the model call, the reply with two tool calls committed."""
    await _submit(store)
    (row,) = (await _claim(store, "me")).rows
    prepared = (await _move(store, moves.prepare(row, freeze=None))).row
    await store.read(lambda c: history.messages(c, prepared))
    intents = [_intent("e1", call="call-1"), _intent("e2", call="call-2")]
    reply = moves.reply(prepared, {"text": None, "tool_calls": CALLS}, {}, intents=intents, first_look=60.0)
    moved = await _move(store, reply)
    history.committed(prepared, moved.row, moved.seq, reply.facts)
    return moved.row


def _holding(ctx: Any) -> Scheduler:
    """A scheduler with free slots (so an apply claims turns for this Brain) that starts no run:
    the test looks at what the apply handed over before any run used it."""
    scheduler = Scheduler(ctx, 10, Wakeups(), 1.0)
    scheduler.adopt = lambda row: None  # type: ignore[method-assign]
    return scheduler


async def _claimed_by(store: BrainStore, history: HistoryCache, *ranges: list[Any]) -> TurnRow:
    applied = await _apply(store, *ranges, budget=ClaimBudget("me", 30.0, 1))
    (row,) = applied.claimed
    seq, facts = applied.entries[row.id]
    history.woken(row, seq, facts, applied.outcomes)
    return row


async def test_a_turn_an_apply_claims_goes_on_from_the_history_it_handed_over(store):
    history = HistoryCache(store)
    await _waiting(store, history)
    row = await _claimed_by(
        store, history, list(_events("e1", result={"n": 1})), list(_events("e2", result="two"))
    )
    counted = Outermost(store, "entries")
    cached = await store.read(lambda c: history.messages(c, row))
    assert counted.asked.count("entries") == 0
    fresh = await store.read(lambda c: HistoryCache(store).messages(c, row))
    assert counted.asked.count("entries") == 1
    assert cached == fresh
    assert [(m.role, m.content.get("result")) for m in cached if m.role == "tool"] == [
        ("tool", {"n": 1}),
        ("tool", "two"),
    ]


async def test_a_result_applied_earlier_makes_the_next_model_call_read_the_journal(store):
    history = HistoryCache(store)
    await _waiting(store, history)
    await _apply(store, list(_events("e1", result=1)))  # the sibling, in an apply before
    row = await _claimed_by(store, history, list(_events("e2", result=2)))
    counted = Outermost(store, "entries")
    cached = await store.read(lambda c: history.messages(c, row))
    assert counted.asked.count("entries") == 1
    fresh = await store.read(lambda c: HistoryCache(store).messages(c, row))
    assert cached == fresh and [m.content["result"] for m in cached if m.role == "tool"] == [1, 2]


async def test_turns_an_apply_claims_without_their_conversation_kept_here_are_read_for_all_of_them(
    store: BrainStore, tmp_path: Any
) -> None:
    # Given two turns waiting on a tool each, driven by another Brain (nothing of them kept here)
    for n in range(2):
        await _waiting_on(store, await _submit(store, session=f"s{n}"), f"e{n}", freeze={})
    ranges = [[e.model_copy(update={"session_id": f"s{n}"}) for e in _events(f"e{n}", n)] for n in range(2)]
    async with LocalBroker(tmp_path / "queues.sqlite3", Topology("t")) as transport:
        ctx = _context(store, transport)
        consumer = UpdateConsumer(ctx, transport, _holding(ctx))
        # When this Brain's update consumer applies their outcomes (and so claims the turns)
        with Outermost(store, "entries", "sessions_entries", "thread", "threads") as reads:
            claimed = [row for rows in await asyncio.gather(*map(consumer._one, ranges)) for row in rows]
    # Then their conversations and threads were read once for the turns the apply claimed
    # together (what it committed included), not by each run before its model call
    assert len(claimed) == 2 and "entries" not in reads.asked and "thread" not in reads.asked
    for row in claimed:
        assert ctx.threads.known(row.thread_id) is not None
        fresh = await store.read(lambda c, row=row: HistoryCache(store).messages(c, row))
        assert ctx.history.cached(row) == fresh
        assert [m.content.get("result") for m in fresh if m.role == "tool"] == [
            int(row.session_id.removeprefix("ns/s"))
        ]


async def test_the_read_of_the_conversations_an_apply_claimed_holds_up_no_other_apply(
    store: BrainStore, tmp_path: Any, monkeypatch: Any
) -> None:
    # Given two turns waiting on a tool each, driven by another Brain, and a read of the
    # conversations that does not get its connection until let through
    for n in range(2):
        await _waiting_on(store, await _submit(store, session=f"s{n}"), f"e{n}", freeze={})
    ranges = [[e.model_copy(update={"session_id": f"s{n}"}) for e in _events(f"e{n}", n)] for n in range(2)]
    gate, reading = asyncio.Event(), asyncio.Event()
    read = store.read

    async def held(work: Any) -> Any:
        if not reading.is_set():
            reading.set()
            await gate.wait()
        return await read(work)

    monkeypatch.setattr(store, "read", held)
    async with LocalBroker(tmp_path / "queues.sqlite3", Topology("t")) as transport:
        ctx = _context(store, transport)
        consumer = UpdateConsumer(ctx, transport, _holding(ctx))
        # When the first turn's outcome is applied and its conversation's read is held up
        first = asyncio.create_task(consumer._one(ranges[0]))
        await asyncio.wait_for(reading.wait(), 10)
        # Then the second turn's outcome is applied meanwhile (the read holds no transaction and
        # no place in the committer), and its turn claimed
        (second,) = await asyncio.wait_for(consumer._one(ranges[1]), 10)
        assert not first.done()
        gate.set()
        (row,) = await asyncio.wait_for(first, 10)
    # And the read, made after the commit, gave each run the conversation a read of the journal gives
    for claimed in (row, second):
        fresh = await read(lambda c, claimed=claimed: HistoryCache(store).messages(c, claimed))
        assert ctx.history.cached(claimed) == fresh
        assert [m.content.get("result") for m in fresh if m.role == "tool"] == [
            int(claimed.session_id.removeprefix("ns/s"))
        ]


async def test_a_failed_read_after_the_apply_leaves_the_run_to_read_its_own_conversation(
    store: BrainStore, tmp_path: Any, monkeypatch: Any
) -> None:
    # Given a turn waiting on a tool, driven by another Brain, and reads that fail for a while
    await _waiting_on(store, await _submit(store), "e1", freeze={})
    read = store.read

    async def away(work: Any) -> Any:
        raise ConnectionResetError("the database went away")

    monkeypatch.setattr(store, "read", away)
    async with LocalBroker(tmp_path / "queues.sqlite3", Topology("t")) as transport:
        ctx = _context(store, transport)
        consumer = UpdateConsumer(ctx, transport, _holding(ctx))
        # When its outcome is applied (the turn claimed) and the read of its conversation fails
        (row,) = await consumer._one(list(_events("e1", "done")))
    # Then the claim stands and nothing was kept: its run reads the conversation itself
    assert row.lease_owner == ctx.owner and ctx.history.cached(row) is None
    monkeypatch.setattr(store, "read", read)
    messages = await store.read(lambda c: ctx.history.messages(c, row))
    assert [m.content.get("result") for m in messages if m.role == "tool"] == ["done"]


async def test_a_turn_an_apply_claimed_reaches_the_scheduler_though_its_handler_was_cancelled(
    store: BrainStore, tmp_path: Any, monkeypatch: Any
) -> None:
    # Given a turn waiting on its tool, and an update consumer whose apply of the tool's outcome
    # is held inside its transaction until the test lets it through
    await _waiting_on(store, await _submit(store), "e1", freeze={})
    gate, inside = asyncio.Event(), asyncio.Event()
    async with LocalBroker(tmp_path / "queues.sqlite3", Topology("t")) as transport:
        ctx = _context(store, transport)
        scheduler = Scheduler(ctx, 10, Wakeups(), 1.0)
        adopted: list[str] = []
        monkeypatch.setattr(scheduler, "adopt", lambda row: adopted.append(row.id))
        consumer = UpdateConsumer(ctx, transport, scheduler)
        apply = consumer.applier.apply

        async def held(conn: Any, ranges: Any) -> Any:
            inside.set()
            await gate.wait()
            return await apply(conn, ranges)

        consumer.applier.apply = held
        handler = asyncio.create_task(consumer._one(list(_events("e1"))))
        await asyncio.wait_for(inside.wait(), 10)

        # When the handler is cancelled (the broker closed its channel) and the apply commits
        handler.cancel()
        with pytest.raises(asyncio.CancelledError):
            await handler
        gate.set()
        for _ in range(500):
            if adopted:
                break
            await asyncio.sleep(0.01)

    # Then the turn the apply claimed for this Brain is handed to its scheduler all the same, not
    # left to wait out a lease with nobody running it
    row = await store.pool.fetchrow("SELECT id, lease_owner FROM turns")
    assert row["lease_owner"] == ctx.owner and adopted == [row["id"]]
