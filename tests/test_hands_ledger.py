"""The Hands ledger's contract: migrations, fencing, claims, and the events kept in the row.

Run on PostgreSQL and on the embedded SQLite store (one backend each, behind one interface):
these tests keep the two from drifting, and one of them checks that both leave the same facts.
Liveness differs by design (advisory locks vs. the data directory's lock), so its tests are per
backend."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from hands.rules.states import LedgerStatus
from hands.run.relay import messages, stored_events
from hands.run.writer import LedgerWriter
from hands.store import MIGRATIONS, Change, Execution, Ledger, NewExecution, ledger_for
from hands.store.postgres import PostgresLedger
from infra.db import analyze_grown, create_pool, migrate
from infra.db.sqlite import open_pool
from infra.liveness.registrations import LocalWorkerRegistration, WorkerRegistration
from infra.objects.payloads import PayloadCodec
from protocol import (
    AcceptedBody,
    AcceptedEvent,
    FailedBody,
    FailedEvent,
    IllegalTransitionError,
    StaleOwnerError,
    StartedBody,
    StartedEvent,
    SucceededBody,
    SucceededEvent,
    batch_bytes,
    codec,
    loads,
    new_id,
)
from tests.support import (
    TableScans,
    TendonEnv,
    crash,
    freeze,
    session_locking,
    sessions_named,
    wait_for,
)

HEADER = {"namespace": "tests", "session_id": "s1", "request_digest": "d" * 64}


@pytest.fixture
async def pg_pool(tendon: TendonEnv) -> AsyncIterator[asyncpg.Pool]:
    schema = tendon.settings().hands_schema
    pool = await create_pool(tendon.database_url, schema, max_size=4)
    await migrate(pool, schema, MIGRATIONS)
    yield pool
    await pool.close()


async def _open(kind: str, tendon: TendonEnv, tmp_path: Path) -> Ledger:
    if kind == "postgres":
        schema = tendon.settings().hands_schema
        p: Any = await create_pool(tendon.database_url, schema, max_size=4)
    else:
        schema = "hands"
        p = await open_pool(tmp_path / "hands.sqlite3")
    await migrate(p, schema, MIGRATIONS)
    return ledger_for(p)


@pytest.fixture(params=["postgres", "sqlite"])
async def ledger(request: pytest.FixtureRequest, tendon: TendonEnv, tmp_path: Path) -> AsyncIterator[Ledger]:
    store = await _open(request.param, tendon, tmp_path)
    yield store
    await store.close()


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
async def test_a_ledger_says_whether_its_pool_holds_one(kind: str, tendon: TendonEnv, tmp_path: Path) -> None:
    if kind == "postgres":
        empty: Any = await create_pool(
            tendon.database_url, f"{tendon.settings().hands_schema}_none", max_size=1
        )
    else:
        empty = await open_pool(tmp_path / "empty.sqlite3")
    try:
        assert not await ledger_for(empty).exists()
    finally:
        await empty.close()
    migrated = await _open(kind, tendon, tmp_path)
    try:
        assert await migrated.exists()
    finally:
        await migrated.close()


def _event(cls: type, execution_id: str, seq: int, body: Any) -> dict[str, Any]:
    envelope = cls(
        execution_id=execution_id, **HEADER, seq=seq, body=body, message_id=f"{execution_id}:{seq}"
    )
    return envelope.model_dump(mode="json")  # type: ignore[no-any-return]


def _new(
    execution_id: str, owner: str, status: LedgerStatus = LedgerStatus.ACCEPTED, events: int = 1
) -> NewExecution:
    values = {"execution_id": execution_id, "route": "lab", **HEADER, "tool": "echo",
              "binding_digest": "b" * 64, "replay_policy": "safe", "args": {"n": 1}, "status": status,
              "owner": owner}  # fmt: skip
    bodies = [AcceptedBody(worker=owner), StartedBody(attempt=1, worker=owner)][:events]
    classes = [AcceptedEvent, StartedEvent]
    return NewExecution(
        values,
        [_event(c, execution_id, i + 1, b) for i, (c, b) in enumerate(zip(classes, bodies, strict=False))],
    )


async def _execution(ledger: Ledger, owner: str, status: LedgerStatus) -> str:
    execution_id = new_id()
    (row,) = await ledger.transact(lambda conn: ledger.insert(conn, [_new(execution_id, owner, status)]))
    assert row is not None
    return execution_id


async def _get(ledger: Ledger, execution_id: str) -> Execution:
    row = await ledger.read(lambda conn: ledger.get(conn, execution_id))
    assert row is not None
    return row


async def test_migrations_are_idempotent(tendon: TendonEnv, ledger: Ledger) -> None:
    # Given a migrated ledger / When the migrations run again / Then nothing is applied
    assert await migrate(ledger.pool, tendon.settings().hands_schema, MIGRATIONS) == 0


async def test_an_execution_id_is_inserted_once_even_twice_in_one_batch(ledger: Ledger) -> None:
    execution_id = await _execution(ledger, "w1", LedgerStatus.ACCEPTED)
    again = await ledger.transact(lambda conn: ledger.insert(conn, [_new(execution_id, "w2")]))
    assert again == [None]  # a duplicate command writes neither a row nor an event
    # A command delivered twice at once, in one batch: the first is the new row
    other = new_id()
    first, second = await ledger.transact(
        lambda conn: ledger.insert(conn, [_new(other, "w1"), _new(other, "w2")])
    )
    assert first is not None and first.owner == "w1" and second is None
    assert (await _get(ledger, other)).owner == "w1"


async def test_a_commit_from_a_worker_that_no_longer_owns_the_row_is_refused(ledger: Ledger) -> None:
    # Given an execution owned by w2
    execution_id = await _execution(ledger, "w2", LedgerStatus.RUNNING)

    # When w1 tries to change it, Then it is fenced off
    with pytest.raises(StaleOwnerError, match="owned by w2"):
        await ledger.transact(lambda conn: ledger.lock_owned(conn, execution_id, "w1"))


async def test_a_handle_is_kept_only_by_the_owner_of_an_open_row_and_survives_its_changes(
    ledger: Ledger,
) -> None:
    execution_id = await _execution(ledger, "w1", LedgerStatus.RUNNING)
    kept = await ledger.transact(
        lambda conn: ledger.keep_handle(conn, execution_id, "w1", '{"mcp_task":"t1"}')
    )
    stale = await ledger.transact(lambda conn: ledger.keep_handle(conn, execution_id, "w2", "{}"))
    assert (kept, stale) == (True, False)
    row = await _get(ledger, execution_id)
    assert row.handle == '{"mcp_task":"t1"}'
    (after,) = await ledger.transact(
        lambda conn: ledger.change(conn, [Change(row, LedgerStatus.SUCCEEDED, [])])
    )
    assert after is not None and after.handle == row.handle == (await _get(ledger, execution_id)).handle
    closed = await ledger.transact(lambda conn: ledger.keep_handle(conn, execution_id, "w1", "{}"))
    assert not closed, "a closed row keeps the handle it had"


async def test_a_status_change_outside_the_table_is_refused_and_changes_nothing(ledger: Ledger) -> None:
    execution_id = await _execution(ledger, "w1", LedgerStatus.ACCEPTED)
    row = await _get(ledger, execution_id)
    done = _event(SucceededEvent, execution_id, 2, SucceededBody(result={"x": 1}))
    with pytest.raises(IllegalTransitionError):
        await ledger.transact(lambda conn: ledger.change(conn, [Change(row, LedgerStatus.SUCCEEDED, [done])]))
    after = await _get(ledger, execution_id)
    assert after.status is LedgerStatus.ACCEPTED and after.last_seq == 1 and after.result is None


async def test_a_change_appends_its_events_and_one_from_a_row_that_moved_on_changes_nothing(
    ledger: Ledger,
) -> None:
    # Given an accepted execution (event 1) read by its worker
    execution_id = await _execution(ledger, "w1", LedgerStatus.ACCEPTED)
    row = await _get(ledger, execution_id)
    started = _event(StartedEvent, execution_id, 2, StartedBody(attempt=1, worker="w1"))
    # When its start and, in the same batch, a change made from the same (now stale) row commit
    start = Change(row, LedgerStatus.RUNNING, [started], attempts=1, unless_cancelled=True)
    moved, stale = await ledger.transact(lambda conn: ledger.change(conn, [start, start]))
    # Then the first continues the seqs, and the second is refused whole
    assert moved is not None and (moved.status, moved.last_seq, moved.attempts) == (
        LedgerStatus.RUNNING,
        2,
        1,
    )
    assert stale is None
    after = await _get(ledger, execution_id)
    assert [(e["seq"], e["kind"]) for e in after.events] == [(1, "accepted"), (2, "started")]
    assert moved == after  # the row the change returned is the row as stored, column for column
    # A start asked not to run after a cancel is refused once one is asked for
    other = await _execution(ledger, "w1", LedgerStatus.ACCEPTED)
    await ledger.transact(lambda conn: ledger.request_cancel(conn, other))
    fresh = await _get(ledger, other)
    started = _event(StartedEvent, other, 2, StartedBody(attempt=1, worker="w1"))
    refused = await ledger.transact(
        lambda conn: ledger.change(
            conn, [Change(fresh, LedgerStatus.RUNNING, [started], unless_cancelled=True)]
        )
    )
    assert refused == [None] and (await _get(ledger, other)).status is LedgerStatus.ACCEPTED


async def test_the_row_a_change_returns_is_the_row_as_stored(ledger: Ledger) -> None:
    # The PostgreSQL backend returns only what the worker lacks (when it was stamped, whether a
    # cancel was asked for) and makes the rest from the change: both must be the stored row.
    execution_id = await _execution(ledger, "w1", LedgerStatus.ACCEPTED)
    row = await _get(ledger, execution_id)
    started = _event(StartedEvent, execution_id, 2, StartedBody(attempt=1, worker="w1"))
    (running,) = await ledger.transact(
        lambda conn: ledger.change(conn, [Change(row, LedgerStatus.RUNNING, [started], attempts=1)])
    )
    assert running == await _get(ledger, execution_id)
    # Output written (its page moves the row's seq and bytes: the owner reads the row again, as it
    # does after a page), then a cancel asked for after that read (it moves neither)
    await ledger.transact(lambda conn: ledger.add_output(conn, running, "hello"))
    fresh = await _get(ledger, execution_id)
    await ledger.transact(lambda conn: ledger.request_cancel(conn, execution_id))
    assert not fresh.cancel_requested and fresh.output_bytes == 5 and fresh.last_seq == 3
    error = {"code": "tool_error", "message": "boom"}
    failed = _event(FailedEvent, execution_id, 4, FailedBody(error=error))
    change = Change(fresh, LedgerStatus.FAILED, [failed], error=error, output_bytes=5)
    (ended,) = await ledger.transact(lambda conn: ledger.change(conn, [change]))
    stored = await _get(ledger, execution_id)
    assert ended == stored
    assert (stored.status, stored.error, stored.cancel_requested, stored.attempts) == (
        LedgerStatus.FAILED, error, True, 1,
    )  # fmt: skip


async def test_the_row_an_insert_returns_is_the_row_as_stored(ledger: Ledger) -> None:
    # The PostgreSQL backend asks back only what the store made of a new row (its stamps, and the
    # columns a new row takes from their defaults unless given) and keeps the rest as given
    plain = _new(new_id(), "w1")
    started = _new(new_id(), "w1", LedgerStatus.RUNNING, events=2)
    started.values["attempts"] = 1
    error = {"code": "routing_error", "message": "no such tool"}
    rejected = _new(new_id(), "w1", LedgerStatus.FAILED)
    rejected.values.update(error=error, args=None, tool=None)
    rows = await ledger.transact(lambda conn: ledger.insert(conn, [plain, started, rejected]))
    for new, row in zip((plain, started, rejected), rows, strict=True):
        assert row is not None and row == await _get(ledger, new.execution_id)
    assert [(r.attempts, r.last_seq, r.error, r.output_bytes) for r in rows if r is not None] == [
        (0, 1, None, 0), (1, 2, None, 0), (0, 1, error, 0),
    ]  # fmt: skip


async def test_the_events_read_back_are_those_committed_with_the_output_pages_in_their_place(
    ledger: Ledger,
) -> None:
    execution_id = await _execution(ledger, "w1", LedgerStatus.RUNNING)

    async def page(conn: Any) -> tuple[int, int]:
        row = await ledger.lock_owned(conn, execution_id, "w1")
        return await ledger.add_output(conn, row, "hello ")

    assert await ledger.transact(page) == (0, 2)
    row = await _get(ledger, execution_id)
    done = _event(SucceededEvent, execution_id, 3, SucceededBody(result=[1, "x"], output_bytes=6))
    await ledger.transact(lambda conn: ledger.change(conn, [Change(row, LedgerStatus.SUCCEEDED, [done])]))
    events = await ledger.read(lambda conn: stored_events(ledger, conn, execution_id, 1))
    assert [(e["seq"], e["kind"]) for e in events] == [(1, "accepted"), (2, "output_page"), (3, "succeeded")]
    assert events[1]["body"] == {"offset": 0, "data": "hello "} and events[2] == done
    assert {(e["namespace"], e["session_id"], e["request_digest"]) for e in events} == {
        tuple(HEADER.values())
    }
    after = await _get(ledger, execution_id)
    assert after.result == [1, "x"] and after.output_bytes == 6
    assert [e["seq"] for e in await ledger.read(lambda c: stored_events(ledger, c, execution_id, 2))] == [
        2,
        3,
    ]


async def test_both_backends_leave_the_same_facts(tendon: TendonEnv, tmp_path: Path) -> None:
    """The same accept, start, page, outcome, release and claim on each backend leave the same
    rows (times aside)."""

    async def story(ledger: Ledger) -> list[dict[str, Any]]:
        ids = ["e1", "e2"]
        await ledger.transact(
            lambda c: ledger.insert(c, [_new(i, "w1", LedgerStatus.RUNNING, 2) for i in ids])
        )
        row = await _get(ledger, "e1")
        done = _event(SucceededEvent, "e1", 3, SucceededBody(result={"k": [1, 2]}))
        await ledger.transact(lambda c: ledger.change(c, [Change(row, LedgerStatus.SUCCEEDED, [done])]))
        await ledger.transact(lambda c: ledger.release_owners(c, ["w1"]))
        await ledger.transact(lambda c: ledger.claim_orphan(c, "e2", "released-by:w1", "w2"))
        rows = [asdict(await _get(ledger, i)) for i in ids]
        return [{k: v for k, v in r.items() if k not in ("created_at", "updated_at")} for r in rows]

    pg, lite = await _open("postgres", tendon, tmp_path), await _open("sqlite", tendon, tmp_path)
    try:
        assert await story(pg) == await story(lite)
    finally:
        await pg.close()
        await lite.close()


async def test_an_owner_missing_from_workers_counts_as_dead_and_is_claimed_once(ledger: Ledger) -> None:
    # Given a running execution whose owner never registered (or was cleaned away)
    execution_id = await _execution(ledger, "ghost", LedgerStatus.RUNNING)

    # When two workers scan and claim it
    async with ledger.pool.acquire() as conn:
        orphans = await ledger.open_orphans(conn, "lab", "w1", 10)
        first = await ledger.claim_orphan(conn, execution_id, "ghost", "w1")
        second = await ledger.claim_orphan(conn, execution_id, "ghost", "w2")

    # Then it is an orphan, and only the first compare-and-set wins
    assert orphans == [(execution_id, "ghost")]
    assert first is not None and first.owner == "w1"
    assert second is None


async def test_a_live_owners_execution_is_never_claimed_and_a_dead_ones_is_handed_back(
    tendon: TendonEnv, pg_pool: asyncpg.Pool
) -> None:
    ledger = ledger_for(pg_pool)
    schema = tendon.settings().hands_schema
    judging = {"grace": 0.3, "interval": 0.05, "release": ledger.release_owners}
    # Given an execution owned by a registered, live worker, and another worker that judges
    async with WorkerRegistration(tendon.database_url, schema, "hands", **judging) as judge:
        async with WorkerRegistration(tendon.database_url, schema, "hands") as reg:
            execution_id = await _execution(ledger, reg.worker_id, LedgerStatus.RUNNING)
            async with pg_pool.acquire() as conn:
                # Then nobody may claim it while it lives
                assert await ledger.open_orphans(conn, "lab", "w1", 10) == []
                assert await ledger.claim_orphan(conn, execution_id, reg.worker_id, "w1") is None
            # When it dies (as by SIGKILL: its session gone, nothing renewed)
            crash(reg)

        # Then once its lock has been gone for the grace, it is presumed dead, and the
        # execution is handed to a released name in the same transaction: an orphan, fenced
        async def handed_back() -> list[tuple[str, str]]:
            async with pg_pool.acquire() as conn:
                return await ledger.open_orphans(conn, "lab", judge.worker_id, 10)

        orphans = await wait_for(handed_back, timeout=10, what="the dead owner's execution")
        assert orphans == [(execution_id, f"released-by:{reg.worker_id}")]
        async with pg_pool.acquire() as conn:
            with pytest.raises(StaleOwnerError):
                await ledger.lock_owned(conn, execution_id, reg.worker_id)
            claimed = await ledger.claim_orphan(conn, execution_id, orphans[0][1], "w1")
        assert claimed is not None and claimed.owner == "w1"


async def test_a_dead_workers_sessions_are_ended_so_an_execution_row_it_still_locks_is_handed_back(
    tendon: TendonEnv, pg_pool: asyncpg.Pool
) -> None:
    ledger = ledger_for(pg_pool)
    schema = tendon.settings().hands_schema
    judging = {"grace": 0.3, "interval": 0.05, "release": ledger.release_owners}
    lock = "SELECT execution_id FROM executions WHERE execution_id = $1 FOR UPDATE"
    # Given a worker inside a body that freezes while one of its sessions holds the execution's row
    # locked mid-transaction (as while it saves a page: not idle, so no timeout ends it)
    async with WorkerRegistration(tendon.database_url, schema, "hands", lease_seconds=1.0) as frozen:
        execution_id = await _execution(ledger, frozen.worker_id, LedgerStatus.RUNNING)
        freeze(frozen)
        async with session_locking(tendon.database_url, schema, frozen.worker_id, lock, execution_id):
            # When another worker judges it dead once its lease ran out
            async with WorkerRegistration(tendon.database_url, schema, "hands", **judging) as judge:
                # Then its sessions are ended first, and the execution is handed back in bounded
                # time instead of the judgement waiting on the row lock forever
                async def handed_back() -> list[tuple[str, str]]:
                    async with pg_pool.acquire() as conn:
                        return await ledger.open_orphans(conn, "lab", judge.worker_id, 10)

                orphans = await wait_for(handed_back, timeout=15, what="the execution handed back")
                assert orphans == [(execution_id, f"released-by:{frozen.worker_id}")]
                assert await sessions_named(pg_pool, frozen.worker_id) == 0


async def test_a_released_execution_becomes_an_orphan_for_every_worker_including_its_owner(
    ledger: Ledger,
) -> None:
    execution_id = await _execution(ledger, "w1", LedgerStatus.RUNNING)
    async with ledger.pool.acquire() as conn:
        assert await ledger.release(conn, execution_id, "w1")
        assert await ledger.open_orphans(conn, "lab", "w1", 10) == [(execution_id, "released-by:w1")]


async def test_on_sqlite_an_owner_from_an_earlier_opening_of_the_file_is_dead(tmp_path: Path) -> None:
    first = await open_pool(tmp_path / "hands.sqlite3")
    await migrate(first, "hands", MIGRATIONS)
    ledger = ledger_for(first)
    async with LocalWorkerRegistration(first, "hands") as old:
        execution_id = await _execution(ledger, old.worker_id, LedgerStatus.RUNNING)
        async with first.acquire() as conn:
            assert await ledger.open_orphans(conn, "lab", "w1", 10) == []
        crash(old)
    await first.close()  # the process that had the data directory is gone
    second = await open_pool(tmp_path / "hands.sqlite3")
    ledger = ledger_for(second)
    try:
        judging = {"interval": 0.05, "release": ledger.release_owners}
        async with LocalWorkerRegistration(second, "hands", **judging) as new:

            async def handed_back() -> list[tuple[str, str]]:
                async with second.acquire() as conn:
                    return await ledger.open_orphans(conn, "lab", new.worker_id, 10)

            [(orphan, released)] = await wait_for(handed_back, timeout=10, what="the old owner's execution")
            async with second.acquire() as conn:
                claimed = await ledger.claim_orphan(conn, orphan, released, "w2")
        assert orphan == execution_id and claimed is not None and claimed.owner == "w2"
    finally:
        await second.close()


async def _grow(conn: asyncpg.Connection, first: int, end: int) -> None:
    """Executions first..end-1 of route lab (one in ten still open), each with an output page."""
    await conn.execute(
        """INSERT INTO executions
                  (execution_id, route, request_digest, namespace, session_id, owner, status, open)
           SELECT 'e' || g, 'lab', 'd', 'ns', 's', 'w', 'succeeded', g % 10 = 0
             FROM generate_series($1::int, $2::int - 1) g""",
        first,
        end,
    )
    await conn.execute(
        """INSERT INTO output_chunks (execution_id, byte_offset, seq, data)
           SELECT 'e' || g, 0, 2, 'x' FROM generate_series($1::int, $2::int - 1) g""",
        first,
        end,
    )


async def test_tables_that_grew_from_nothing_are_analyzed_so_a_cached_plan_is_made_again(
    pg_pool: asyncpg.Pool,
) -> None:
    # Given a generic plan for the recovery scan's kind of query, settled while the ledger was nearly empty
    async with pg_pool.acquire() as conn:
        await _grow(conn, 0, 20)
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        await conn.execute(
            """PREPARE due(text) AS SELECT e.execution_id, o.seq FROM executions e
                 JOIN output_chunks o USING (execution_id)
                WHERE e.open AND e.route = $1 ORDER BY 1, 2 LIMIT 500"""
        )

        async def plan() -> str:
            return "\n".join(r[0] for r in await conn.fetch("EXPLAIN EXECUTE due('lab')"))

        small = await plan()
        assert await analyze_grown(pg_pool) == []  # 20 rows: nothing worth analyzing

        # When both tables grow by thousands of rows within seconds
        await _grow(conn, 20, 3000)
        await conn.execute("SELECT pg_stat_force_next_flush()")  # counters visible at once
        deadline = time.monotonic() + 15
        while not await conn.fetchval(
            "SELECT count(*) = 2 FROM pg_stat_user_tables WHERE schemaname = current_schema()"
            " AND relname IN ('output_chunks', 'executions') AND n_live_tup >= 2900"
        ):
            assert time.monotonic() < deadline, "the insert counts never reached the statistics views"
            await asyncio.sleep(0.1)

        # Then the statistics keeper analyzes them, and the cached plan is made again
        assert {"output_chunks", "executions"} <= set(await analyze_grown(pg_pool))
        assert await plan() != small
        assert await analyze_grown(pg_pool) == []  # fresh statistics: nothing more to do


async def test_an_event_is_encoded_once_then_stored_sized_and_published_as_those_bytes(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker's writer and every JSON encoding of anything that holds an event counted
    encodings: list[Any] = []
    encoder = codec._ENCODER

    class Counted:
        def encode(self, value: Any) -> str:
            if _holds_event(value):
                encodings.append(value)
            return encoder.encode(value)

    monkeypatch.setattr(codec, "_ENCODER", Counted())
    sent: list[dict[str, Any]] = []
    writer = LedgerWriter(ledger, PayloadCodec(None, 256 * 1024), sent.extend)
    execution_id = new_id()
    new = _new(execution_id, "w1")
    accepted = await writer.event(execution_id, HEADER, 1, AcceptedBody(worker="w1"))
    # When it accepts, starts and finishes an execution, and the relay sends what was committed
    row = await writer.insert(NewExecution(new.values, [accepted]))
    assert row is not None
    started = await writer.event(execution_id, HEADER, 2, StartedBody(attempt=1, worker="w1"))
    row = await writer.change(Change(row, LedgerStatus.RUNNING, [started], attempts=1))
    assert row is not None
    done = await writer.event(execution_id, HEADER, 3, SucceededBody(result={"é": [1, 2]}))
    assert await writer.change(Change(row, LedgerStatus.SUCCEEDED, [done])) is not None
    wire = [batch_bytes(batch) for batch in messages(sent, 1024 * 1024)]
    # Then each event was encoded once, when it was made: the ledger's column, the relay's
    # sizing and the message took the bytes it carries. (The portable backend writes a row's whole
    # list with each change, and the events it read back from the row are encoded again.)
    again = [] if isinstance(ledger, PostgresLedger) else [1, 1, 2]
    assert sorted(e["seq"] for e in encodings) == sorted([1, 2, 3, *again])
    assert [e["seq"] for e in loads(wire[0])["events"]] == [1, 2, 3] and len(wire) == 1
    # And what the ledger holds reads back as what was sent
    assert (await _get(ledger, execution_id)).events == loads(wire[0])["events"]


def _holds_event(value: Any) -> bool:
    if isinstance(value, dict):
        return "seq" in value or any(_holds_event(v) for v in value.values())
    return isinstance(value, list) and any(_holds_event(v) for v in value)


class _Counted:
    """A connection that counts the statements sent through it."""

    def __init__(self, conn: Any) -> None:
        self.conn, self.statements = conn, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.conn, name)
        if name not in ("fetch", "fetchrow", "fetchval", "execute", "executemany"):
            return attr

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.statements += 1
            return await attr(*args, **kwargs)

        return counted


async def test_accepts_and_changes_written_together_are_each_what_it_would_be_alone(ledger: Ledger) -> None:
    # Given an accepted execution read by its worker
    running = await _execution(ledger, "w1", LedgerStatus.ACCEPTED)
    row = await _get(ledger, running)
    started = _event(StartedEvent, running, 2, StartedBody(attempt=1, worker="w1"))
    start = Change(row, LedgerStatus.RUNNING, [started], attempts=1)
    fresh = new_id()
    counted: list[_Counted] = []

    async def write(conn: Any) -> Any:
        counted.append(_Counted(conn))
        return await ledger.write(counted[-1], [_new(fresh, "w1"), _new(running, "w2")], [start, start])

    # When a new accept, a copy of the running one's command, its start and the same start again
    # commit together (as the worker's group committer sends them: one statement where
    # statements commit alone)
    inserted, changed = await ledger.transact(write, single_statement=True)

    # Then the new row is in and the duplicate is not; the start moved the row, its copy did not
    assert [r.execution_id if r else None for r in inserted] == [fresh, None]
    assert changed[0] is not None and (changed[0].status, changed[0].last_seq) == (LedgerStatus.RUNNING, 2)
    assert changed[1] is None
    assert (await _get(ledger, fresh)).status is LedgerStatus.ACCEPTED
    after = await _get(ledger, running)
    assert changed[0] == after and inserted[0] == await _get(ledger, fresh)  # as stored
    assert after.owner == "w1" and [e["kind"] for e in after.events] == ["accepted", "started"]
    if ledger.ONE_STATEMENT_COMMITS:
        assert counted[-1].statements == 1


async def test_a_lone_change_finds_its_row_by_key_in_a_ledger_of_a_hundred_rows_and_more(
    pg_pool: asyncpg.Pool,
) -> None:
    # Given a ledger of 150 rows, analyzed (as the statistics keeper does from 100 rows), and a
    # pool whose statements run with generic plans, as every Tendon pool's do
    ledger = ledger_for(pg_pool)
    async with pg_pool.acquire() as conn:
        await _grow(conn, 0, 150)
        await conn.execute("ANALYZE executions")
        (row,) = await ledger.insert(conn, [_new(new_id(), "w1")])
        assert row is not None

        scans = TableScans(conn, "executions")
        before = await scans.now()
        # When one execution changes, on its own (a lone turn's outcome)
        started = _event(StartedEvent, row.execution_id, 2, StartedBody(attempt=1, worker="w1"))
        (moved,) = await ledger.change(conn, [Change(row, LedgerStatus.RUNNING, [started], attempts=1)])
        assert moved is not None
        # Then its row was found by its key, not by reading the table whole (with an unnest of
        # parameters, taken for ten rows, the plan read all 150)
        seq, by_index = await scans.since(before)
        assert seq == 0, "the change read the ledger whole"
        assert by_index > 0
