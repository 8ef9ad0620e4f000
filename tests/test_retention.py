"""Retention's rules, and what each store's prune may and may not touch, on PostgreSQL and on
the embedded SQLite store alike (rows are made old by moving their times back)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from brain.store import BrainStore
from brain.verbs import observe
from hands.rules.states import LedgerStatus
from hands.store import Ledger
from infra.db import Json
from infra.db.retention import BATCH, Horizon, every, may_have_been_pruned, prune_once
from protocol import GoneError, id_time, new_id, new_timed_id
from tests.test_brain_store import _submit, store  # noqa: F401 - the fixture, on both backends
from tests.test_hands_ledger import _new, ledger  # noqa: F401 - the fixture, on both backends

DAY = 86400.0


# ---- the rules ----------------------------------------------------------------------------


def test_a_timed_id_is_a_uuid7_that_tells_its_time_and_a_random_one_tells_none() -> None:
    made = new_timed_id()
    assert uuid.UUID(made).version == 7 and uuid.UUID(made).variant == uuid.RFC_4122
    assert abs(id_time(f"exe-{made}") - time.time()) < 1  # type: ignore[operator]
    assert id_time(uuid.uuid4().hex) is None and id_time("exe-short") is None
    assert len({new_timed_id() for _ in range(1000)}) == 1000


def test_a_random_id_is_a_uuid4_that_never_passes_for_a_timed_one() -> None:
    made = [new_id() for _ in range(2000)]
    assert len(set(made)) == len(made)
    for value in made:
        parsed = uuid.UUID(value)
        assert (parsed.hex, parsed.version, parsed.variant) == (value, 4, uuid.RFC_4122)
        assert id_time(f"exe-{value}") is None


def _id_born(seconds_ago: float) -> str:
    ms = int((time.time() - seconds_ago) * 1000)
    return f"exe-{ms:012x}7{new_timed_id()[13:]}"


@pytest.mark.parametrize(
    ("age", "horizon", "pruned"),
    [
        (0.5 * DAY, 7 * DAY, False),  # young: its absence means it never came
        (6.2 * DAY, 7 * DAY, False),
        (6.4 * DAY, 7 * DAY, True),  # within a tenth of the horizon: the clocks may disagree
        (30 * DAY, 7 * DAY, True),
        (30 * DAY, 0.0, False),  # nothing is ever pruned
    ],
)
def test_a_command_is_judged_by_its_age_once_its_row_may_have_been_pruned(
    age: float, horizon: float, pruned: bool
) -> None:
    assert may_have_been_pruned(_id_born(age), time.time(), horizon) is pruned


def test_an_id_without_a_time_is_judged_as_before() -> None:
    assert not may_have_been_pruned(f"exe-{new_id()}", time.time() + 365 * DAY, 7 * DAY)


def test_pruning_runs_at_a_quarter_of_the_shortest_horizon_at_most_hourly() -> None:
    async def nothing(conn: Any, horizon: float, limit: int) -> int:
        return 0

    assert every([]) == 3600
    assert every([Horizon("a", 0, nothing)]) == 3600
    assert every([Horizon("a", 400, nothing), Horizon("b", 7 * DAY, nothing)]) == 100


async def test_a_prune_goes_on_in_batches_until_nothing_old_is_left() -> None:
    rows = list(range(2 * BATCH + 7))
    calls: list[int] = []

    async def prune(conn: Any, horizon: float, limit: int) -> int:
        calls.append(limit)
        gone = rows[:limit]
        del rows[:limit]
        return len(gone)

    async def transact(work: Any) -> Any:
        return await work(None)

    counts = await prune_once(transact, [Horizon("rows", 60, prune), Horizon("kept", 0, prune)])
    assert counts == {"rows": 2 * BATCH + 7} and rows == [] and calls == [BATCH] * 3


# ---- the Brain: the journal of long-closed sessions -----------------------------------------


async def _close(s: BrainStore, name: str, seconds_ago: float, *, finish: bool = True) -> None:
    session = f"ns/{name}"  # the store's key of namespace ns's session

    async def work(conn: Any) -> None:
        if finish:
            await conn.execute("UPDATE turns SET status = 'completed' WHERE session_id = $1", session)
            assert await s.sessions.close_session(conn, session, f"session {name!r}")
        else:  # what closing refuses; pruning must not trust that it never happens
            await conn.execute("UPDATE sessions SET closed_at = now() WHERE id = $1", session)
        await conn.execute(
            "UPDATE sessions SET closed_at = ts_add(now(), $2) WHERE id = $1", session, -seconds_ago
        )

    await s.transact(work)


async def test_only_the_journal_of_sessions_closed_past_the_horizon_with_every_turn_ended_goes(
    store: BrainStore,  # noqa: F811
) -> None:
    for session in ("s-old", "s-recent", "s-open", "s-unfinished"):
        await _submit(store, request_id=f"r-{session}", session=session)
    await _close(store, "s-old", 2000)
    await _close(store, "s-recent", 10)
    await _close(store, "s-unfinished", 2000, finish=False)
    kept = {
        s: await store.read(lambda c, k=f"ns/{s}": store.journal.last_seq(c, k)) for s in ("s-old", "s-open")
    }

    gone = await store.transact(lambda c: store.retention.prune_journal(c, 1000, 10))

    assert gone == 1
    for session in ("s-recent", "s-open", "s-unfinished"):
        page = await observe.list_events(store, namespace="ns", session_id=session)
        assert page.events and page.events[0]["seq"] == 1, session
    # A cursor into what was pruned is gone, never an empty page that looks like the end
    with pytest.raises(GoneError, match="snapshot"):
        await observe.list_events(store, namespace="ns", session_id="s-old", cursor=0)
    last = kept["s-old"]
    assert (await observe.list_events(store, namespace="ns", session_id="s-old", cursor=last)).events == []
    snapshot = await observe.snapshot(store, namespace="ns", session_id="s-old")
    assert snapshot["cursor"] == last and len(snapshot["turns"]) == 1
    assert await store.transact(lambda c: store.retention.prune_journal(c, 1000, 10)) == 0


async def test_parked_messages_are_pruned_after_their_horizon(store: BrainStore) -> None:  # noqa: F811
    await _parked_are_pruned(store)


async def _parked_are_pruned(s: Any) -> None:
    async def park(conn: Any, seconds_ago: float) -> None:
        await s.record_parked(
            conn, queue="q", message_id=new_id(), reason="r", headers=Json({}), body=b"x", kind=None,
            execution_id=None, surfaced="logged",
        )  # fmt: skip
        await conn.execute(
            "UPDATE parked SET parked_at = ts_add(now(), $1) WHERE id = (SELECT max(id) FROM parked)",
            -seconds_ago,
        )

    for age in (2000, 3000, 10):
        await s.transact(lambda c, age=age: park(c, age))
    assert await s.transact(lambda c: s.prune_parked(c, 1000, 1)) == 1
    assert await s.transact(lambda c: s.prune_parked(c, 1000, 10)) == 1
    assert len(await s.read(lambda c: s.parked_listing(c, 10))) == 1


# ---- the Hands: finished executions and their output ----------------------------------------


BACKDATE = "UPDATE executions SET updated_at = ts_add(now(), $2) WHERE execution_id = $1"
OUTPUT = "INSERT INTO output_chunks (execution_id, byte_offset, data) VALUES ($1, 0, 'out')"


async def test_only_finished_executions_past_the_horizon_go_with_their_output(
    ledger: Ledger,  # noqa: F811
) -> None:
    S = LedgerStatus
    ages = {
        S.SUCCEEDED: 2000, S.FAILED: 2000, S.CANCELLED: 2000,  # finished long ago: pruned
        S.UNKNOWN: 2000, S.RUNNING: 2000, S.ACCEPTED: 2000,  # waiting for a person, or open: kept
    }  # fmt: skip
    ids = {status: f"exe-{new_timed_id()}" for status in ages}
    recent = f"exe-{new_timed_id()}"

    async def make(conn: Any) -> None:
        rows = [_new(ids[s], "w1", s) for s in ages] + [_new(recent, "w1", S.SUCCEEDED)]
        assert all(await ledger.insert(conn, rows))
        for status, age in ages.items():
            await conn.execute(
                "UPDATE executions SET updated_at = ts_add(now(), $2) WHERE execution_id = $1",
                ids[status],
                -age,
            )
        for execution_id in (ids[S.SUCCEEDED], ids[S.UNKNOWN]):
            await conn.execute(
                "INSERT INTO output_chunks (execution_id, byte_offset, data) VALUES ($1, 0, 'out')",
                execution_id,
            )

    await ledger.transact(make)

    assert await ledger.transact(lambda c: ledger.prune_finished(c, 1000, 2)) == 2
    assert await ledger.transact(lambda c: ledger.prune_finished(c, 1000, 2)) == 1
    assert await ledger.transact(lambda c: ledger.prune_finished(c, 1000, 2)) == 0

    left = {
        r["execution_id"] for r in await ledger.read(lambda c: c.fetch("SELECT execution_id FROM executions"))
    }
    assert left == {ids[S.UNKNOWN], ids[S.RUNNING], ids[S.ACCEPTED], recent}
    chunks = await ledger.read(lambda c: c.fetch("SELECT execution_id FROM output_chunks"))
    assert [r["execution_id"] for r in chunks] == [ids[S.UNKNOWN]]
    await _parked_are_pruned(ledger)
