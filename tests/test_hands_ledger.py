"""The Hands ledger's contract: migrations, fencing, claims and the event outbox.

Run on PostgreSQL and on the embedded SQLite store: the same SQL serves both, and these
tests keep the two from drifting. Liveness differs by design (advisory locks vs. the data
directory's lock), so its tests are per backend."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from hands import ledger
from hands.states import LedgerStatus
from infra.db import analyze_grown, create_pool, migrate, transact
from infra.liveness import LocalWorkerRegistration, WorkerRegistration
from infra.payloads import PayloadCodec
from infra.sqlite import open_pool
from protocol import (
    AcceptedBody,
    ConflictError,
    IllegalTransitionError,
    StaleOwnerError,
    StartedBody,
    decode,
    new_id,
)
from tests.support import TendonEnv, crash, wait_for

CODEC = PayloadCodec(None, 1024 * 1024)


@pytest.fixture
async def pg_pool(tendon: TendonEnv) -> AsyncIterator[asyncpg.Pool]:
    schema = tendon.settings().hands_schema
    pool = await create_pool(tendon.database_url, schema, max_size=4)
    await migrate(pool, schema, ledger.MIGRATIONS)
    yield pool
    await pool.close()


@pytest.fixture(params=["postgres", "sqlite"])
async def pool(request: pytest.FixtureRequest, tendon: TendonEnv, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "postgres":
        schema = tendon.settings().hands_schema
        p: Any = await create_pool(tendon.database_url, schema, max_size=4)
    else:
        p = await open_pool(tmp_path / "hands.sqlite3")
    await migrate(p, tendon.settings().hands_schema, ledger.MIGRATIONS)
    yield p
    await p.close()


async def _execution(pool: asyncpg.Pool, owner: str, status: LedgerStatus) -> str:
    execution_id = new_id()

    async def work(conn: asyncpg.Connection) -> Any:
        return await ledger.insert_execution(
            conn,
            execution_id=execution_id,
            route="lab",
            request_digest="d" * 64,
            namespace="tests",
            session_id="s1",
            tool="echo",
            binding_digest="b" * 64,
            replay_policy="safe",
            args={},
            status=status,
            owner=owner,
        )

    assert await transact(pool, work) is not None
    return execution_id


async def test_migrations_are_idempotent(tendon: TendonEnv, pool: asyncpg.Pool) -> None:
    # Given a migrated ledger / When the migrations run again / Then nothing is applied
    assert await migrate(pool, tendon.settings().hands_schema, ledger.MIGRATIONS) == 0


async def test_an_execution_id_is_inserted_once(pool: asyncpg.Pool) -> None:
    execution_id = await _execution(pool, "w1", LedgerStatus.ACCEPTED)
    async with pool.acquire() as conn:
        again = await ledger.insert_execution(
            conn,
            execution_id=execution_id,
            route="lab",
            request_digest="e" * 64,
            namespace="tests",
            session_id="s1",
            owner="w2",
        )
    assert again is None


async def test_a_commit_from_a_worker_that_no_longer_owns_the_row_is_refused(
    pool: asyncpg.Pool,
) -> None:
    # Given an execution owned by w2
    execution_id = await _execution(pool, "w2", LedgerStatus.RUNNING)

    # When w1 tries to change it, Then it is fenced off
    async def work(conn: asyncpg.Connection) -> None:
        await ledger.lock_owned(conn, execution_id, "w1")

    with pytest.raises(StaleOwnerError, match="owned by w2"):
        await transact(pool, work)


async def test_a_status_change_outside_the_table_is_refused_and_changes_nothing(
    pool: asyncpg.Pool,
) -> None:
    execution_id = await _execution(pool, "w1", LedgerStatus.ACCEPTED)

    async def work(conn: asyncpg.Connection) -> None:
        row = await ledger.lock_owned(conn, execution_id, "w1")
        await ledger.move(conn, row, LedgerStatus.SUCCEEDED, result={"x": 1})

    with pytest.raises(IllegalTransitionError):
        await transact(pool, work)
    async with pool.acquire() as conn:
        row = await ledger.get_execution(conn, execution_id)
    assert row is not None and row.status is LedgerStatus.ACCEPTED and row.result is None


async def test_an_owner_missing_from_workers_counts_as_dead_and_is_claimed_once(pool: asyncpg.Pool) -> None:
    # Given a running execution whose owner never registered (or was cleaned away)
    execution_id = await _execution(pool, "ghost", LedgerStatus.RUNNING)

    # When two workers scan and claim it
    async with pool.acquire() as conn:
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
    pool = pg_pool
    schema = tendon.settings().hands_schema
    judging = {"grace": 0.3, "interval": 0.05, "release": ledger.release_owners}
    # Given an execution owned by a registered, live worker, and another worker that judges
    async with WorkerRegistration(tendon.database_url, schema, "hands", **judging) as judge:
        async with WorkerRegistration(tendon.database_url, schema, "hands") as reg:
            execution_id = await _execution(pool, reg.worker_id, LedgerStatus.RUNNING)
            async with pool.acquire() as conn:
                # Then nobody may claim it while it lives
                assert await ledger.open_orphans(conn, "lab", "w1", 10) == []
                assert await ledger.claim_orphan(conn, execution_id, reg.worker_id, "w1") is None
            # When it dies (as by SIGKILL: its session gone, nothing renewed)
            crash(reg)

        # Then once its lock has been gone for the grace, it is presumed dead, and the
        # execution is handed to a released name in the same transaction: an orphan, fenced
        async def handed_back() -> list[tuple[str, str]]:
            async with pool.acquire() as conn:
                return await ledger.open_orphans(conn, "lab", judge.worker_id, 10)

        orphans = await wait_for(handed_back, timeout=10, what="the dead owner's execution")
        assert orphans == [(execution_id, f"released-by:{reg.worker_id}")]
        async with pool.acquire() as conn:
            with pytest.raises(StaleOwnerError):
                await ledger.lock_owned(conn, execution_id, reg.worker_id)
            claimed = await ledger.claim_orphan(conn, execution_id, orphans[0][1], "w1")
        assert claimed is not None and claimed.owner == "w1"


async def test_a_released_execution_becomes_an_orphan_for_every_worker_including_its_owner(
    pool: asyncpg.Pool,
) -> None:
    execution_id = await _execution(pool, "w1", LedgerStatus.RUNNING)
    async with pool.acquire() as conn:
        assert await ledger.release(conn, execution_id, "w1")
        assert await ledger.open_orphans(conn, "lab", "w1", 10) == [(execution_id, "released-by:w1")]


async def test_events_get_contiguous_seqs_and_carry_the_rows_headers(pool: asyncpg.Pool) -> None:
    execution_id = await _execution(pool, "w1", LedgerStatus.ACCEPTED)

    async def work(conn: asyncpg.Connection) -> list[int]:
        return [
            await ledger.append_event(conn, CODEC, execution_id, AcceptedBody(worker="w1")),
            await ledger.append_event(conn, CODEC, execution_id, StartedBody(attempt=1, worker="w1")),
        ]

    assert await transact(pool, work) == [1, 2]
    async with pool.acquire() as conn:
        pending = await ledger.pending_events(conn, route="lab", execution_ids=[execution_id])
    envelopes = [decode(e.payload) for e in pending]
    assert [(e.seq, e.kind) for e in envelopes] == [(1, "accepted"), (2, "started")]
    assert {(e.namespace, e.session_id, e.request_digest) for e in envelopes} == {("tests", "s1", "d" * 64)}


def _values(execution_id: str, owner: str) -> dict[str, Any]:
    return {
        "execution_id": execution_id,
        "route": "lab",
        "request_digest": "d" * 64,
        "namespace": "tests",
        "session_id": "s1",
        "tool": "echo",
        "replay_policy": "safe",
        "args": {},
        "owner": owner,
    }


async def test_a_new_row_and_its_first_event_are_written_together_and_only_once(pool: Any) -> None:
    execution_id = new_id()

    async def insert(conn: Any, owner: str) -> ledger.Execution | None:
        values = _values(execution_id, owner)
        return await ledger.insert_with_event(conn, CODEC, values, AcceptedBody(worker=owner))

    first = await transact(pool, lambda c: insert(c, "w1"))
    again = await transact(pool, lambda c: insert(c, "w2"))
    assert first is not None and first.last_seq == 1 and first.status is LedgerStatus.ACCEPTED
    assert again is None  # a duplicate command writes neither a row nor an event
    async with pool.acquire() as conn:
        pending = await ledger.pending_events(conn, execution_ids=[execution_id])
    assert [(decode(e.payload).seq, decode(e.payload).body.worker) for e in pending] == [(1, "w1")]


async def test_a_move_with_its_event_continues_the_seqs_and_refuses_a_row_that_moved_on(
    pool: Any,
) -> None:
    execution_id = await _execution(pool, "w1", LedgerStatus.ACCEPTED)
    async with pool.acquire() as conn:
        stale = await ledger.get_execution(conn, execution_id)  # read, not locked
    assert stale is not None

    async def start(conn: Any) -> ledger.Execution:
        row = await ledger.lock_owned(conn, execution_id, "w1")
        await ledger.append_event(conn, CODEC, execution_id, AcceptedBody(worker="w1"))
        row = await ledger.lock_owned(conn, execution_id, "w1")
        return await ledger.move_and_append(
            conn, CODEC, row, LedgerStatus.RUNNING, StartedBody(attempt=1, worker="w1"), attempts=1
        )

    moved = await transact(pool, start)
    assert (moved.status, moved.last_seq, moved.attempts) == (LedgerStatus.RUNNING, 2, 1)
    async with pool.acquire() as conn:
        pending = await ledger.pending_events(conn, execution_ids=[execution_id])
        row = await ledger.get_execution(conn, execution_id)
    assert [(e.seq, decode(e.payload).kind) for e in pending] == [(1, "accepted"), (2, "started")]
    assert row is not None and row.status is LedgerStatus.RUNNING and row.last_seq == 2

    # A row read before others moved it on (accepted at seq 0, now running at 2) cannot be
    # moved blind: its event would carry a seq that is taken, from a status it no longer has.
    with pytest.raises(ConflictError, match="no longer accepted at seq 0"):
        await transact(
            pool,
            lambda c: ledger.move_and_append(
                c, CODEC, stale, LedgerStatus.RUNNING, StartedBody(attempt=1, worker="w1")
            ),
        )
    async with pool.acquire() as conn:
        after = await ledger.get_execution(conn, execution_id)
    assert after is not None and after.last_seq == 2


async def test_a_replay_that_lands_while_publishing_is_not_marked_published(
    pool: asyncpg.Pool,
) -> None:
    # Given two events read by the relay for publishing
    execution_id = await _execution(pool, "w1", LedgerStatus.ACCEPTED)

    async def add(conn: asyncpg.Connection) -> None:
        await ledger.append_event(conn, CODEC, execution_id, AcceptedBody(worker="w1"))
        await ledger.append_event(conn, CODEC, execution_id, StartedBody(attempt=1, worker="w1"))

    await transact(pool, add)
    async with pool.acquire() as conn:
        read = await ledger.pending_events(conn, execution_ids=[execution_id])
        # When a replay from seq 2 arrives before the relay marks them
        assert await ledger.republish_from(conn, execution_id, 2) == 1
        marked = await ledger.mark_published(conn, read)
        left = await ledger.pending_events(conn, execution_ids=[execution_id])
    # Then seq 1 is published, and seq 2 stays due to be published again
    assert marked == 1
    assert [e.seq for e in left] == [2]


async def test_on_sqlite_an_owner_from_an_earlier_opening_of_the_file_is_dead(tmp_path: Path) -> None:
    first = await open_pool(tmp_path / "hands.sqlite3")
    await migrate(first, "hands", ledger.MIGRATIONS)
    async with LocalWorkerRegistration(first, "hands") as old:
        execution_id = await _execution(first, old.worker_id, LedgerStatus.RUNNING)
        async with first.acquire() as conn:
            assert await ledger.open_orphans(conn, "lab", "w1", 10) == []
        crash(old)
    await first.close()  # the process that had the data directory is gone
    second = await open_pool(tmp_path / "hands.sqlite3")
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
    """Executions first..end-1 of route lab, each with three unpublished events."""
    await conn.execute(
        """INSERT INTO executions
                  (execution_id, route, request_digest, namespace, session_id, owner, status)
           SELECT 'e' || g, 'lab', 'd', 'ns', 's', 'w', 'succeeded'
             FROM generate_series($1::int, $2::int - 1) g""",
        first,
        end,
    )
    await conn.execute(
        """INSERT INTO events (execution_id, seq, kind, payload)
           SELECT 'e' || g, s, 'accepted', '\\x00'::bytea
             FROM generate_series($1::int, $2::int - 1) g, generate_series(1, 3) s""",
        first,
        end,
    )


async def test_tables_that_grew_from_nothing_are_analyzed_so_a_cached_plan_is_made_again(
    pg_pool: asyncpg.Pool,
) -> None:
    # Given a generic plan for the relay's kind of scan, settled while the ledger was nearly empty
    async with pg_pool.acquire() as conn:
        await _grow(conn, 0, 20)
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        await conn.execute(
            """PREPARE due(text) AS SELECT ev.execution_id, ev.seq FROM events ev
                 JOIN executions e USING (execution_id)
                WHERE ev.published_at IS NULL AND e.route = $1 ORDER BY 1, 2 LIMIT 500"""
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
            " AND relname IN ('events', 'executions') AND n_live_tup >= 3000"
        ):
            assert time.monotonic() < deadline, "the insert counts never reached the statistics views"
            await asyncio.sleep(0.1)

        # Then the statistics keeper analyzes them, and the cached plan is made again
        assert {"events", "executions"} <= set(await analyze_grown(pg_pool))
        assert await plan() != small
        assert await analyze_grown(pg_pool) == []  # fresh statistics: nothing more to do
