"""The Brain's store contract, run against PostgreSQL and the embedded SQLite store alike:
durable submit, fencing, atomic commits, sequencing, repairs. The same store functions run on
both, so these tests are what keeps the two backends from drifting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from brain import verbs
from brain.agents import AgentDefinition
from brain.app import open_store
from brain.scanner import RepairScanner
from brain.sequencing import Arrival
from brain.states import TurnPhase, TurnStatus
from brain.store import executions, repairs, turns
from brain.store.migrations import MIGRATIONS
from infra.broker import Broker
from infra.db import dialect, lock_class, migrate, transact
from infra.liveness import Liveness, LocalWorkerRegistration, WorkerRegistration
from infra.localqueue import LocalBroker
from infra.sqlite import open_pool
from infra.transport import Delivery, Topology, Transport
from protocol import (
    AcceptedBody,
    AcceptedEvent,
    ConflictError,
    IllegalTransitionError,
    RoutingError,
    StaleOwnerError,
    StartedBody,
    StartedEvent,
    SucceededBody,
    SucceededEvent,
    decode,
)
from tests.support import TendonEnv, crash, orphans_sql, wait_for

AGENT = AgentDefinition(name="a", version="1", model={"kind": "scripted", "script": [{"content": "hi"}]})


@pytest.fixture(params=["postgres", "sqlite"])
async def pool(request: pytest.FixtureRequest, tmp_path: Path, tendon: TendonEnv) -> AsyncIterator[Any]:
    if request.param == "postgres":
        p: Any = await open_store(tendon.settings())
    else:
        p = await open_pool(tmp_path / "brain.sqlite3")
        await migrate(p, "brain", MIGRATIONS)
    yield p
    await p.close()


@pytest.fixture
def schema(pool: Any, tendon: TendonEnv) -> str:
    return tendon.settings().brain_schema if dialect(pool) == "postgres" else "brain"


def register(pool: Any, schema: str, database_url: str | None = None, **options: Any) -> Any:
    """A live worker registration on whichever backend ``pool`` is."""
    if dialect(pool) == "sqlite":
        return LocalWorkerRegistration(pool, "brain", **options)
    assert database_url is not None
    return WorkerRegistration(database_url, schema, "brain", **options)


async def _submit(pool: asyncpg.Pool, request_id: str = "r1", text: str = "hello") -> str:
    turn_id, _ = await transact(
        pool,
        lambda c: turns.submit(
            c, namespace="ns", session_id="s1", request_id=request_id, user_input=text, agent=AGENT
        ),
    )
    return turn_id


async def _submit_in(pool: Any, session_id: str) -> str:
    turn_id, _ = await transact(
        pool,
        lambda c: turns.submit(
            c, namespace="ns", session_id=session_id, request_id="r", user_input="go", agent=AGENT
        ),
    )
    return turn_id


async def _intent(pool: Any, turn_id: str, execution_id: str, route: str | None = None) -> None:
    """A committed intent for call-1 of ``turn_id`` (request digest "d" * 64); with ``route``,
    also its outbox command to that route (session s1)."""
    command: dict[str, Any] = {}
    if route is not None:
        command = {
            "command_message_id": f"m-{execution_id}",
            "command": (Topology("unused").commands(route), b"{}"),
            "session_id": "s1",
        }
    await transact(
        pool,
        lambda c: executions.insert_intent(
            c,
            execution_id=execution_id,
            turn_id=turn_id,
            tool_step=1,
            call_id="call-1",
            binding={"route": route or "lab", "name": "echo", "digest": "b" * 64, "replay_policy": "safe"},
            args={},
            request_digest="d" * 64,
            **command,
        ),
    )


async def test_the_same_request_id_returns_the_original_turn_and_other_input_conflicts(pool):
    first = await _submit(pool)
    assert await _submit(pool) == first
    with pytest.raises(ConflictError, match="already used for a different input"):
        await _submit(pool, text="something else")
    assert await pool.fetchval("SELECT count(*) FROM turns") == 1


async def test_a_session_is_pinned_to_its_agent_version_even_for_the_same_request(pool):
    first = await _submit(pool)
    other = AGENT.model_copy(update={"version": "2"})

    async def submit_other(request_id: str) -> Any:
        return await transact(
            pool,
            lambda c: turns.submit(
                c, namespace="ns", session_id="s1", request_id=request_id, user_input="hello", agent=other
            ),
        )

    # A new request in the session with another version, or the same request with it, is refused
    for request_id in ("r2", "r1"):
        with pytest.raises(ConflictError, match="pinned to agent a version 1, not a version 2"):
            await submit_other(request_id)
    assert await _submit(pool) == first
    assert await pool.fetchval("SELECT count(*) FROM turns") == 1


async def test_turns_of_one_session_share_its_thread_and_its_event_sequence(pool):
    # Given a first turn, which creates the session and its main thread
    first = await _submit(pool, "r1")
    # When a second turn comes in the same session
    second = await _submit(pool, "r2", text="and then")
    # Then both are queued on the one thread, and their events continue one sequence
    rows = await pool.fetch("SELECT id, thread_id, status FROM turns ORDER BY seq")
    assert [(r["id"], r["thread_id"], r["status"]) for r in rows] == [
        (first, "s1", "queued"),
        (second, "s1", "queued"),
    ]
    assert await pool.fetchval("SELECT count(*) FROM threads") == 1
    published = await pool.fetch("SELECT seq, turn_id, kind, data FROM public_events ORDER BY seq")
    assert [(e["seq"], e["turn_id"], e["kind"], e["data"]) for e in published] == [
        (1, first, "turn.accepted", {"request_id": "r1"}),
        (2, second, "turn.accepted", {"request_id": "r2"}),
    ]
    assert await pool.fetchval("SELECT last_event_seq FROM sessions WHERE id = 's1'") == 2
    # And the session cannot be used from another namespace
    with pytest.raises(ConflictError, match="another namespace"):
        await transact(
            pool,
            lambda c: turns.submit(
                c, namespace="other", session_id="s1", request_id="r3", user_input="x", agent=AGENT
            ),
        )


async def test_a_changed_agent_under_the_same_version_is_refused(pool):
    await _submit(pool)
    changed = AGENT.model_copy(update={"instructions": "be different"})
    with pytest.raises(ConflictError, match="new version"):
        await transact(
            pool,
            lambda c: turns.submit(
                c, namespace="ns", session_id="s2", request_id="r", user_input="x", agent=changed
            ),
        )


async def test_a_stale_owner_cannot_commit_and_its_whole_transaction_rolls_back(pool, schema, pg_url):
    turn_id = await _submit(pool)
    async with register(pool, schema, pg_url) as a:
        lease_a, _, _ = await transact(pool, lambda c: turns.claim(c, a.worker_id, 30))
        # Given A's lease expired and B took the turn over with a new epoch
        await pool.execute("UPDATE turns SET lease_expires_at = now() - make_interval(secs => 1)")
        async with register(pool, schema, pg_url) as b:
            lease_b, _, _ = await transact(pool, lambda c: turns.claim(c, b.worker_id, 30))
            assert lease_b.epoch == lease_a.epoch + 1

            # When A tries to commit its next phase together with a history entry
            async def stale_commit(conn: asyncpg.Connection) -> None:
                await turns.append_history(conn, "s1", turn_id, "user", {"text": "late"})
                await turns.advance(conn, lease_a, phase=TurnPhase.MODEL_REQUEST)

            # Then it is fenced out and nothing of that transaction remains
            with pytest.raises(StaleOwnerError):
                await transact(pool, stale_commit)
            assert await pool.fetchval("SELECT count(*) FROM history") == 0
            row = await pool.fetchrow("SELECT phase, lease_owner FROM turns WHERE id = $1", turn_id)
            assert (row["phase"], row["lease_owner"]) == ("prepare", b.worker_id)


async def test_a_claim_records_its_run_and_a_run_started_event_in_the_session_order(pool, schema, pg_url):
    turn_id = await _submit(pool)
    async with register(pool, schema, pg_url) as a:
        lease, row, _ = await transact(pool, lambda c: turns.claim(c, a.worker_id, 30))
        assert (row["id"], row["status"], row["lease_owner"]) == (turn_id, "running", a.worker_id)
        nothing = await transact(pool, lambda c: turns.claim(c, a.worker_id, 30))
    assert nothing is None  # the only turn is leased to a live owner
    run = await pool.fetchrow(
        "SELECT turn_id, owner, epoch, started_phase FROM runs WHERE id = $1", lease.run_id
    )
    assert dict(run) == {
        "turn_id": turn_id,
        "owner": a.worker_id,
        "epoch": lease.epoch,
        "started_phase": "prepare",
    }
    published = await pool.fetch(
        "SELECT seq, kind, data FROM public_events WHERE session_id = 's1' ORDER BY seq"
    )
    assert [(e["seq"], e["kind"]) for e in published] == [(1, "turn.accepted"), (2, "turn.run_started")]
    assert published[1]["data"] == {
        "run_id": lease.run_id,
        "run": 1,
        "phase": "prepare",
        "epoch": lease.epoch,
    }


async def test_a_claim_says_whether_another_turn_was_claimable_beside_the_one_it_took(pool, schema, pg_url):
    # Given two claimable turns in two sessions
    first, second = await _submit_in(pool, "s1"), await _submit_in(pool, "s2")
    async with register(pool, schema, pg_url) as a:
        # When a driver claims one, the claim says another is waiting (pass the hint on)
        one = await transact(pool, lambda c: turns.claim(c, a.worker_id, 30))
        # and the claim that takes the last one says nothing else is (no second driver woken)
        two = await transact(pool, lambda c: turns.claim(c, a.worker_id, 30))
    assert {one.lease.turn_id, two.lease.turn_id} == {first, second}
    assert (one.more, two.more) == (True, False)


async def test_a_move_the_tables_forbid_is_refused_by_the_owner_and_changes_nothing(pool, schema, pg_url):
    turn_id = await _submit(pool)
    async with register(pool, schema, pg_url) as a:
        lease, _, _ = await transact(pool, lambda c: turns.claim(c, a.worker_id, 30))

        # When the owning run tries to jump from PREPARE straight to FINALIZE, or to COMPLETED
        with pytest.raises(IllegalTransitionError, match="turn phase cannot move from prepare to finalize"):
            await transact(pool, lambda c: turns.advance(c, lease, phase=TurnPhase.FINALIZE))
        await transact(pool, lambda c: turns.advance(c, lease, status=TurnStatus.WAITING))
        with pytest.raises(IllegalTransitionError, match="turn cannot move from waiting to completed"):
            await transact(pool, lambda c: turns.advance(c, lease, status=TurnStatus.COMPLETED))

        # Then the turn is where the last legal move left it, and legal moves still work
        row = await pool.fetchrow("SELECT phase, status, revision FROM turns WHERE id = $1", turn_id)
        assert (row["phase"], row["status"]) == ("prepare", "waiting")
        moved = await transact(pool, lambda c: turns.advance(c, lease, phase=TurnPhase.MODEL_REQUEST))
        assert (moved["phase"], moved["revision"]) == ("model_request", row["revision"] + 1)


def releasing(pool: Any, schema: str, database_url: str | None = None, **options: Any) -> Any:
    """A live Brain registration that judges the others and hands back the turns of the dead."""
    options = {"grace": 0.3, "interval": 0.05, **options}
    options["release"] = lambda conn, dead: turns.release_owners(conn, dead, "wake")
    if dialect(pool) == "sqlite":
        return LocalWorkerRegistration(pool, "brain", **options)
    assert database_url is not None
    return WorkerRegistration(database_url, schema, "brain", **options)


async def _claimable(pool: Any) -> bool:
    async with pool.acquire() as conn:
        return await turns.anything_claimable(conn)


async def test_a_killed_owner_is_taken_over_after_the_grace_not_its_lease(pg_pool, tendon):
    # Given a turn claimed under a one-hour lease by a Brain that is then killed (SQLite: see
    # the test of an earlier opening of the file, the only way a worker dies there)
    pool, schema = pg_pool, tendon.settings().brain_schema
    turn_id = await _submit(pool)
    async with register(pool, schema, tendon.database_url) as a:
        await transact(pool, lambda c: turns.claim(c, a.worker_id, 3600))
        crash(a)
    # When another Brain judges (once it has been up for its grace)
    async with releasing(pool, schema, tendon.database_url) as c:
        assert not await _claimable(pool)
        await wait_for(lambda: _claimable(pool), timeout=10, what="the dead owner's turn handed back")
        # Then the dead owner is recorded as such, and the turn goes to a new run, epoch 2
        dead = await pool.fetchval("SELECT dead_at IS NOT NULL FROM workers WHERE id = $1", a.worker_id)
        assert dead
        claimed = await transact(pool, lambda conn: turns.claim(conn, c.worker_id, 30))
        assert claimed is not None and claimed.lease.epoch == 2 and claimed.lease.turn_id == turn_id
    assert await pool.fetchval("SELECT count(*) FROM runs") == 2


async def test_a_frozen_owner_is_presumed_dead_once_its_lease_ran_out(pg_pool, tendon):
    # PostgreSQL (the lock outlives a frozen process there). Given a Brain whose keeper stops
    # renewing (frozen) while its session, and so its lock, live on
    pool = pg_pool
    schema = tendon.settings().brain_schema
    turn_id = await _submit(pool)
    async with register(pool, schema, tendon.database_url, lease_seconds=1.0) as frozen:
        await transact(pool, lambda c: turns.claim(c, frozen.worker_id, 3600))
        assert frozen._keeper is not None
        frozen._keeper.cancel()
        async with releasing(pool, schema, tendon.database_url) as judge:
            # Then its turn is handed back once its lease ran out, though its lock is held
            await wait_for(lambda: _claimable(pool), timeout=10, what="the frozen owner's turn")
            row = await pool.fetchrow("SELECT lease_owner FROM turns WHERE id = $1", turn_id)
            assert row["lease_owner"] is None
            # and when it wakes, its renewal finds it dead: it must stop (``lost``)
            assert not await frozen.renew()
            assert frozen.lost.is_set()
            assert await transact(pool, lambda c: turns.claim(c, judge.worker_id, 30)) is not None


async def test_a_lost_liveness_connection_taken_again_within_the_grace_keeps_the_work(pg_pool, tendon):
    # Given a Brain holding a turn, and another that judges every 50 ms
    pool = pg_pool
    schema = tendon.settings().brain_schema
    turn_id = await _submit(pool)
    async with (
        register(pool, schema, tendon.database_url, grace=3.0, interval=0.05) as owner,
        releasing(pool, schema, tendon.database_url, grace=3.0) as judge,
    ):
        await transact(pool, lambda c: turns.claim(c, owner.worker_id, 3600))
        await wait_for(lambda: _settled(judge), timeout=10, what="the judge to settle")
        # When the owner's liveness session is ended under it (a cut connection, a restart)
        ended = await pool.fetchval(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid = $1::oid AND objid = $2::oid",
            lock_class(schema),
            await pool.fetchval("SELECT lock_key FROM workers WHERE id = $1", owner.worker_id),
        )
        assert ended
        # Then it connects again and takes its lock back in time: nobody presumes it dead
        await wait_for(
            lambda: _holds_lock(pool, schema, owner.worker_id), timeout=10, what="the lock taken again"
        )
        await asyncio.sleep(0.5)  # several judgements later
        assert not owner.lost.is_set()
        row = await pool.fetchrow("SELECT dead_at, lock_lost_at FROM workers WHERE id = $1", owner.worker_id)
        assert row["dead_at"] is None and row["lock_lost_at"] is None
        assert (await pool.fetchrow("SELECT lease_owner FROM turns WHERE id = $1", turn_id))[
            0
        ] == owner.worker_id
        assert judge.worker_id != owner.worker_id


async def _settled(registration: Liveness) -> bool:
    return registration.settled


async def _holds_lock(pool: Any, schema: str, worker_id: str) -> bool:
    return bool(
        await pool.fetchval(
            """SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN workers w ON l.objid = w.lock_key::oid
                WHERE w.id = $1 AND l.locktype = 'advisory' AND l.granted AND l.classid = $2::oid)""",
            worker_id,
            lock_class(schema),
        )
    )


async def test_a_lost_lock_whose_process_the_broker_no_longer_sees_is_a_death_at_once(pg_pool, tendon):
    # Given a Brain holding a turn, announced on the broker, and a judge that would otherwise
    # give a lost lock 30 s to come back
    pool, schema = pg_pool, tendon.settings().brain_schema
    turn_id = await _submit(pool)
    topology = Topology(tendon.prefix)
    async with (
        Broker(tendon.amqp_url, topology) as mine,
        Broker(tendon.amqp_url, topology) as theirs,
        register(pool, schema, tendon.database_url, presence=mine) as owner,
        releasing(pool, schema, tendon.database_url, grace=30.0, interval=0.05, presence=theirs) as judge,
    ):
        await transact(pool, lambda c: turns.claim(c, owner.worker_id, 3600))
        assert await theirs.present(topology.presence(owner.worker_id))
        await wait_for(lambda: _settled(judge), timeout=10, what="the judge to settle")

        # When only its database session ends (its connection cut, its process still there)
        crash(owner)
        await asyncio.sleep(1.0)  # many judgements
        # Then it is not presumed dead: the broker still sees it, the grace is its to use
        assert not await _claimable(pool)

        # When its broker connection ends too (the process is gone)
        await mine.__aexit__(None, None, None)
        # Then it is dead at once, not after the 30 s grace
        await wait_for(lambda: _claimable(pool), timeout=10, what="the turn handed back")
        held = await pool.fetchval("SELECT lease_owner FROM turns WHERE id = $1", turn_id)
        assert held is None


async def test_a_stopping_brain_hands_its_turns_back_at_once(pool, schema, tendon):
    turn_id = await _submit(pool)
    async with releasing(pool, schema, tendon.database_url) as a:
        await transact(pool, lambda c: turns.claim(c, a.worker_id, 3600))
        assert not await _claimable(pool)
    # Leaving the block retired it: dead now, its turn claimable without any wait
    assert await _claimable(pool)
    assert await pool.fetchval("SELECT dead_at IS NOT NULL FROM workers WHERE id = $1", a.worker_id)
    assert (await pool.fetchrow("SELECT lease_owner FROM turns WHERE id = $1", turn_id))[0] is None


async def test_dead_workers_rows_are_pruned_after_a_while(pool, schema, tendon):
    async with releasing(pool, schema, tendon.database_url) as a:
        pass
    async with releasing(pool, schema, tendon.database_url, interval=0.05, grace=0.05) as judge:
        await pool.execute(
            "UPDATE workers SET dead_at = now() - make_interval(secs => 7200) WHERE id = $1", a.worker_id
        )

        async def pruned() -> bool:
            return await pool.fetchval("SELECT count(*) FROM workers WHERE id = $1", a.worker_id) == 0

        await wait_for(pruned, timeout=10, what="the dead worker's row pruned")
        assert await pool.fetchval("SELECT count(*) FROM workers WHERE id = $1", judge.worker_id) == 1


async def test_events_apply_once_in_order_whatever_order_they_arrive_in(pool):
    turn_id = await _submit(pool)
    digest = "d" * 64
    await _intent(pool, turn_id, "e1")
    header = {"execution_id": "e1", "namespace": "ns", "session_id": "s1", "request_digest": digest}
    accepted = AcceptedEvent(seq=1, body=AcceptedBody(worker="w"), **header)
    started = StartedEvent(seq=2, body=StartedBody(attempt=1, worker="w"), **header)
    done = SucceededEvent(seq=3, body=SucceededBody(result={"ok": True}), **header)

    async def receive(event) -> Arrival:  # type: ignore[no-untyped-def]
        return await transact(pool, lambda c: executions.receive(c, event, "unused_channel"))

    assert await receive(done) is Arrival.HOLD
    assert await receive(accepted) is Arrival.APPLY
    assert await receive(accepted) is Arrival.DUPLICATE
    assert await receive(done) is Arrival.HOLD  # a second copy of a held event is kept once
    assert await pool.fetchval("SELECT count(*) FROM held_events") == 1
    row = await pool.fetchrow("SELECT status, last_seq FROM executions WHERE id = 'e1'")
    assert (row["status"], row["last_seq"]) == ("accepted", 1)
    assert await receive(started) is Arrival.APPLY
    row = await pool.fetchrow("SELECT status, last_seq, result FROM executions WHERE id = 'e1'")
    assert (row["status"], row["last_seq"], row["result"]) == ("succeeded", 3, {"ok": True})
    assert await pool.fetchval("SELECT count(*) FROM held_events") == 0
    kinds = await pool.fetch("SELECT kind FROM public_events WHERE kind LIKE 'execution.%' ORDER BY seq")
    assert [k["kind"] for k in kinds] == [
        "execution.accepted",
        "execution.running",
        "execution.succeeded",
    ]


async def test_an_event_from_another_session_is_refused(pool):
    turn_id = await _submit(pool)
    await _intent(pool, turn_id, "e2")
    forged = AcceptedEvent(
        seq=1,
        body=AcceptedBody(worker="w"),
        execution_id="e2",
        namespace="ns",
        session_id="other",
        request_digest="d" * 64,
    )
    with pytest.raises(RoutingError, match="belongs to ns/s1"):
        await transact(pool, lambda c: executions.receive(c, forged, "unused_channel"))


async def test_a_lost_wake_up_is_repaired_by_the_periodic_scan(pool):
    # Given a turn parked WAITING whose only execution finished, but whose wake hint was lost
    turn_id = await _submit(pool)
    await _intent(pool, turn_id, "e3")
    await pool.execute("UPDATE executions SET status = 'succeeded' WHERE id = 'e3'")
    await pool.execute(
        "UPDATE turns SET status = 'waiting', phase = 'wait_tools', tool_step = 1 WHERE id = $1", turn_id
    )
    # When the repair scan runs
    await transact(pool, lambda c: executions.wake_stuck_turns(c, "unused_channel"))
    # Then the turn is claimable again; a turn still waiting on a running tool is left alone
    assert await pool.fetchval("SELECT status FROM turns WHERE id = $1", turn_id) == "running"
    await pool.execute("UPDATE executions SET status = 'running' WHERE id = 'e3'")
    await pool.execute("UPDATE turns SET status = 'waiting' WHERE id = $1", turn_id)
    await transact(pool, lambda c: executions.wake_stuck_turns(c, "unused_channel"))
    assert await pool.fetchval("SELECT status FROM turns WHERE id = $1", turn_id) == "waiting"


@pytest.fixture
async def pg_pool(tendon: TendonEnv) -> AsyncIterator[Any]:
    p = await open_store(tendon.settings())
    yield p
    await p.close()


async def test_two_sibling_executions_finishing_at_once_wake_their_turn(pg_pool):
    # PostgreSQL only: SQLite runs one write transaction at a time, siblings cannot overlap.
    pool = pg_pool
    # Given a turn waiting on two running executions of one step
    turn_id = await _submit(pool)
    for n in (1, 2):
        await transact(
            pool,
            lambda c, n=n: executions.insert_intent(
                c,
                execution_id=f"sib{n}",
                turn_id=turn_id,
                tool_step=1,
                call_id=f"call-{n}",
                binding={"route": "lab", "name": "echo", "digest": "b" * 64, "replay_policy": "safe"},
                args={},
                request_digest="d" * 64,
            ),
        )
    await pool.execute("UPDATE executions SET status = 'running', last_seq = 2")
    await pool.execute(
        "UPDATE turns SET status = 'waiting', phase = 'wait_tools', tool_step = 1 WHERE id = $1", turn_id
    )

    def done(n: int) -> SucceededEvent:
        return SucceededEvent(
            seq=3,
            body=SucceededBody(result=n),
            execution_id=f"sib{n}",
            namespace="ns",
            session_id="s1",
            request_digest="d" * 64,
        )

    # When both results are applied in overlapping transactions
    async with pool.acquire() as first:
        tx = first.transaction()
        await tx.start()
        await executions.receive(first, done(1), "unused_channel")
        second = asyncio.create_task(
            transact(pool, lambda c: executions.receive(c, done(2), "unused_channel"))
        )
        await asyncio.sleep(0.3)
        # Then the second waits for the first (the turn's lock) ...
        assert not second.done()
        await tx.commit()
    await asyncio.wait_for(second, 10)
    # ... and, seeing its sibling's committed result, wakes the turn
    assert await pool.fetchval("SELECT status FROM turns WHERE id = $1", turn_id) == "running"


async def test_an_event_applied_while_a_later_one_is_being_held_drains_it(pg_pool):
    # PostgreSQL only (overlapping transactions). Given an accepted execution (seq 1)
    pool = pg_pool
    turn_id = await _submit(pool)
    await _intent(pool, turn_id, "h1")
    header = {"execution_id": "h1", "namespace": "ns", "session_id": "s1", "request_digest": "d" * 64}
    await transact(
        pool,
        lambda c: executions.receive(c, AcceptedEvent(seq=1, body=AcceptedBody(worker="w"), **header), "ch"),
    )
    started = StartedEvent(seq=2, body=StartedBody(attempt=1, worker="w"), **header)
    done = SucceededEvent(seq=3, body=SucceededBody(result={"ok": True}), **header)

    # When seq 3 is being held by one transaction while another applies seq 2
    async with pool.acquire() as holder:
        tx = holder.transaction()
        await tx.start()
        assert await executions.receive(holder, done, "ch") is Arrival.HOLD
        applying = asyncio.create_task(transact(pool, lambda c: executions.receive(c, started, "ch")))
        await asyncio.sleep(0.3)
        assert not applying.done()  # it waits for the execution's row
        await tx.commit()
    assert await asyncio.wait_for(applying, 10) is Arrival.APPLY

    # Then the one applying seq 2 saw the hold and applied seq 3 after it: nothing left held
    row = await pool.fetchrow("SELECT status, last_seq, holding FROM executions WHERE id = 'h1'")
    assert (row["status"], row["last_seq"], row["holding"]) == ("succeeded", 3, False)
    assert await pool.fetchval("SELECT count(*) FROM held_events") == 0


async def test_a_claim_that_meets_a_turn_claimed_since_its_snapshot_leaves_it_to_the_new_owner(
    pg_pool, tendon
):
    # PostgreSQL only (overlapping statements). Given a queued turn, and a claim whose scan
    # saw it free but which reaches it only after another claim committed (the scan is made
    # slow here to open that window for sure; under load it opens by itself)
    pool = pg_pool
    schema = tendon.settings().brain_schema
    turn_id = await _submit(pool)
    slow_claim = turns._CLAIM_PG.replace(
        "WHERE t.status IN", "WHERE pg_sleep(0.3) IS NOT NULL AND t.status IN", 1
    )
    async with (
        register(pool, schema, tendon.database_url) as first,
        register(pool, schema, tendon.database_url) as late,
    ):
        async with pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            claiming = asyncio.create_task(conn.fetchrow(slow_claim, late.worker_id, 30.0))
            await asyncio.sleep(0.1)  # the late claim has its snapshot and is scanning
            lease, _, _ = await transact(pool, lambda c: turns.claim(c, first.worker_id, 30))
            # When the late claim gets to the row
            taken = await asyncio.wait_for(claiming, 10)
            await tx.rollback()
        # Then it takes nothing: the turn stays with its live owner
        assert taken is None
        row = await pool.fetchrow("SELECT lease_owner, lease_epoch FROM turns WHERE id = $1", turn_id)
        assert (row["lease_owner"], row["lease_epoch"]) == (first.worker_id, lease.epoch)


async def test_concurrent_claims_never_take_a_turn_from_a_live_owner(pg_pool, tendon):
    # PostgreSQL only. Given 30 turns and 8 claimers of one live Brain that each hold a turn
    # for a moment and then give it back (as a run that waits does)
    pool = pg_pool
    schema = tendon.settings().brain_schema
    for i in range(30):
        await _submit_in(pool, f"s{i}")
    fenced: list[str] = []
    claims = 0
    async with register(pool, schema, tendon.database_url) as brain:

        async def claimer(until: float) -> None:
            nonlocal claims
            while asyncio.get_running_loop().time() < until:
                got = await transact(pool, lambda c: turns.claim(c, brain.worker_id, 30))
                if got is None:
                    await asyncio.sleep(0.001)
                    continue
                claims += 1
                lease = got.lease
                await asyncio.sleep(0.002)
                try:  # giving it back is fenced: it fails if another claim took the turn
                    await transact(pool, lambda c, lease=lease: turns.advance(c, lease, release=True))
                except StaleOwnerError:
                    fenced.append(lease.turn_id)

        # When they claim for a few seconds (bounded)
        until = asyncio.get_running_loop().time() + 4
        await asyncio.wait_for(asyncio.gather(*(claimer(until) for _ in range(8))), 30)
    # Then every claim found its turn free: no owner lost one it held
    assert claims > 100
    assert fenced == []


async def test_on_sqlite_the_workers_of_an_earlier_opening_of_the_file_are_dead_at_once(tmp_path):
    first = await open_pool(tmp_path / "brain.sqlite3")
    await migrate(first, "brain", MIGRATIONS)
    await _submit(first)
    async with LocalWorkerRegistration(first, "brain") as a:
        await transact(first, lambda c: turns.claim(c, a.worker_id, 3600))
        crash(a)
    await first.close()  # the process "dies": its one-hour lease must not protect the turn
    second = await open_pool(tmp_path / "brain.sqlite3")
    try:
        async with releasing(second, "brain") as b:
            await wait_for(lambda: _claimable(second), timeout=10, what="the turn handed back")
            claimed = await transact(second, lambda c: turns.claim(c, b.worker_id, 30))
            assert claimed is not None and claimed[0].epoch == 2
            assert await transact(second, lambda c: turns.claim(c, "other", 30)) is None
    finally:
        await second.close()


@pytest.mark.parametrize("result", ["plain text", 42, None, [1, "two"], {"ok": True}, True])
async def test_a_result_of_any_json_type_reads_back_as_it_was_sent(pool, result):
    turn_id = await _submit(pool)
    await _intent(pool, turn_id, "e4")
    header = {"execution_id": "e4", "namespace": "ns", "session_id": "s1", "request_digest": "d" * 64}
    for event in (
        AcceptedEvent(seq=1, body=AcceptedBody(worker="w"), **header),
        StartedEvent(seq=2, body=StartedBody(attempt=1, worker="w"), **header),
        SucceededEvent(seq=3, body=SucceededBody(result=result), **header),
    ):
        await transact(pool, lambda c, e=event: executions.receive(c, e, "unused_channel"))
    row = await pool.fetchrow("SELECT result FROM executions WHERE id = 'e4'")
    assert row["result"] == result and type(row["result"]) is type(result)


async def test_a_stalled_command_is_not_sent_again_while_commands_wait_in_its_queue(
    pool: Any, tendon: TendonEnv, tmp_path: Path
) -> None:
    # Given a published command that Hands has not acknowledged for 5 s (stall after 1 s)
    turn_id = await _submit(pool)
    queue = Topology(tendon.prefix).commands("lab")
    tendon.routes.add("lab")  # its queues are deleted at teardown
    await transact(
        pool,
        lambda c: executions.insert_intent(
            c,
            execution_id="e7",
            turn_id=turn_id,
            tool_step=1,
            call_id="call-1",
            binding={"route": "lab", "name": "echo", "digest": "b" * 64, "replay_policy": "safe"},
            args={},
            request_digest="d" * 64,
            command_message_id="m-e7",
            command=(queue, b"{}"),
            session_id="s1",
        ),
    )
    async with pool.acquire() as conn:
        await conn.execute("UPDATE outbox SET published_at = now()")
        await conn.execute("UPDATE executions SET updated_at = $1", datetime.now(UTC) - timedelta(seconds=5))
    transport: Transport = (
        Broker(tendon.amqp_url, Topology(tendon.prefix))
        if dialect(pool) == "postgres"
        else LocalBroker(tmp_path / "queues.sqlite3", Topology(tendon.prefix))
    )
    async with transport:
        scanner = _scanner(pool, tendon, transport)
        # and a busy pool: its one consumer works on a command, another waits in line
        held: list[Delivery] = []

        async def hold(delivery: Delivery) -> None:
            held.append(delivery)

        busy = await transport.consume(queue, hold, prefetch=1)
        await transport.publish(queue, b"worked on", message_id="m-busy")
        await transport.publish(queue, b"ahead", message_id="m-ahead")

        async def one_held_one_waiting() -> bool:
            return bool(held) and await transport.waiting(queue) == 1

        await wait_for(one_held_one_waiting, timeout=10, what="a busy pool")

        # When the scan passes, it sends nothing again: the command is most likely in that line
        assert await scanner.scan_once() == 0
        assert await scanner.scan_once() == 0  # also once it knows the route is busy
        assert await pool.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0
        assert await pool.fetchval("SELECT stall_backoff FROM executions WHERE id = 'e7'") == 1

        async def take_all(name: str) -> None:
            taken: list[Delivery] = []

            async def take(delivery: Delivery) -> None:
                taken.append(delivery)
                await delivery.ack()

            consumer = await transport.consume(name, take, prefetch=1)
            deadline = asyncio.get_running_loop().time() + 10
            while await transport.waiting(name) or not taken:
                assert asyncio.get_running_loop().time() < deadline, f"nothing was taken from {name}"
                await asyncio.sleep(0.02)
            await consumer.close()

        # When the command line is gone (the pool served it, and waits for more) but events wait
        # for the Brains (its answer may be there)
        await busy.close()
        await take_all(queue)
        idle = await transport.consume(queue, hold, prefetch=1)
        updates = Topology(tendon.prefix).updates
        await transport.publish(updates, b"an event", message_id="m-event")
        assert await scanner.scan_once() == 0

        # Then once no line is left, the command is sent again (it may have been lost)
        await take_all(updates)
        assert await scanner.scan_once() == 1
        assert await pool.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 1
        assert await pool.fetchval("SELECT stall_backoff FROM executions WHERE id = 'e7'") == 2
        await idle.close()


def _scanner(pool: Any, tendon: TendonEnv, transport: Transport, **options: Any) -> RepairScanner:
    return RepairScanner(
        pool,
        Topology(tendon.prefix),
        wake_channel="unused_channel",
        gap_timeout=1.0,
        stall_seconds=1.0,
        interval=1.0,
        outbox_ready=lambda: None,
        waiting=transport.waiting,
        consumers=transport.consumers,
        **options,
    )


async def test_a_command_nobody_serves_is_not_sent_again_and_its_turn_fails_after_the_attempts(
    pool: Any, tendon: TendonEnv, tmp_path: Path
) -> None:
    # Given an execution whose command was published to a route that no pool consumes
    turn_id = await _submit(pool)
    await _intent(pool, turn_id, "e8", route="gone")
    tendon.routes.add("gone")
    transport: Transport = (
        Broker(tendon.amqp_url, Topology(tendon.prefix))
        if dialect(pool) == "postgres"
        else LocalBroker(tmp_path / "queues.sqlite3", Topology(tendon.prefix))
    )
    async with transport:
        scanner = _scanner(pool, tendon, transport, repair_attempts=3)
        for attempt in range(1, 4):
            async with pool.acquire() as conn:
                await conn.execute("UPDATE outbox SET published_at = now()")
                await conn.execute(
                    "UPDATE executions SET updated_at = $1, replay_requested_at = $1",
                    datetime.now(UTC) - timedelta(seconds=600),
                )
            # When the scan passes: nothing is sent again (nobody would take it), but it counts
            assert await scanner.scan_once() == 0
            assert await pool.fetchval("SELECT nudges FROM executions WHERE id = 'e8'") == attempt
            assert await pool.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0
        async with pool.acquire() as conn:
            await conn.execute(
                "UPDATE executions SET updated_at = $1, replay_requested_at = $1",
                datetime.now(UTC) - timedelta(seconds=600),
            )
        # Then, the attempts used up, the turn fails with an error naming the silent route,
        # and its execution is settled: cancelled here, and its Hands told (a cancel control)
        assert await scanner.scan_once() == 1
    turn = await pool.fetchrow("SELECT status, error FROM turns WHERE id = $1", turn_id)
    assert turn["status"] == "failed" and turn["error"]["code"] == "no_answer"
    assert "route gone" in turn["error"]["message"] and "e8" in turn["error"]["message"]
    row = await pool.fetchrow("SELECT status, error FROM executions WHERE id = 'e8'")
    assert row["status"] == "cancelled" and "turn ended first" in row["error"]["message"]
    cancel = await pool.fetchrow("SELECT queue, payload FROM outbox WHERE published_at IS NULL")
    assert cancel["queue"] == Topology(tendon.prefix).controls("gone")
    assert decode(bytes(cancel["payload"])).kind == "cancel"
    kinds = [r["kind"] for r in await pool.fetch("SELECT kind FROM public_events ORDER BY seq")]
    assert kinds[-2:] == ["turn.failed", "execution.cancelled"]


async def test_a_stalled_execution_is_nudged_ever_less_often_until_it_makes_progress(pool):
    # Given an intended execution with no progress for 5 s (stall after 1 s)
    turn_id = await _submit(pool)
    await _intent(pool, turn_id, "e9")

    async def ago(column: str, seconds: float) -> None:
        when = datetime.now(UTC) - timedelta(seconds=seconds)
        async with pool.acquire() as conn:
            await conn.execute(f"UPDATE executions SET {column} = $1 WHERE id = 'e9'", when)

    async def stalled() -> list[str]:
        return [r["id"] for r in await transact(pool, lambda c: repairs.stalled(c, 1.0))]

    await ago("updated_at", 5)
    assert await stalled() == ["e9"]

    # When it was nudged 1.5 s ago, it waits (the second nudge comes after 2 s), then 4 s
    await transact(pool, lambda c: repairs.mark_nudged(c, "e9"))
    await ago("replay_requested_at", 1.5)
    assert await stalled() == []
    await ago("replay_requested_at", 2.5)
    assert await stalled() == ["e9"]
    await transact(pool, lambda c: repairs.mark_nudged(c, "e9"))
    await ago("replay_requested_at", 3.5)
    assert await stalled() == []

    # Then progress starts the spacing over
    header = {"execution_id": "e9", "namespace": "ns", "session_id": "s1", "request_digest": "d" * 64}
    accepted = AcceptedEvent(seq=1, body=AcceptedBody(worker="w"), **header)
    await transact(pool, lambda c: executions.receive(c, accepted, "unused_channel"))
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT stall_backoff FROM executions WHERE id = 'e9'") == 1


@pytest.mark.parametrize("session_exists", [False, True])
async def test_concurrent_submits_of_one_request_agree_on_one_turn(pg_pool, session_exists):
    # PostgreSQL only (SQLite has one writer at a time). Given eight submits of one request id
    # racing in eight transactions, half of them with another input
    pool = pg_pool
    if session_exists:
        await _submit(pool, request_id="earlier")

    async def submit(text: str) -> str | Exception:
        try:
            turn_id, _ = await verbs.submit(
                pool,
                namespace="ns",
                session_id="s1",
                request_id="same",
                user_input=text,
                agent=AGENT,
                wake_channel="wake",
            )
            return turn_id
        except Exception as exc:  # noqa: BLE001 - what each caller got is the point
            return exc

    texts = ["one", "other"] * 4
    answers = await asyncio.gather(*(submit(t) for t in texts))

    # Then one turn exists; callers with its input got it, the others a ConflictError, and no
    # caller saw a unique-constraint error
    (turn,) = await pool.fetch("SELECT id, input FROM turns WHERE request_id = 'same'")
    for text, answer in zip(texts, answers, strict=True):
        if text == turn["input"]["text"]:
            assert answer == turn["id"]
        else:
            assert isinstance(answer, ConflictError), answer


async def test_the_store_checks_no_foreign_keys_and_the_orphan_query_sees_what_they_would(pool):
    # Given a turn, and a run row written for a turn that does not exist (a bug would do it)
    await _submit(pool)
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO runs (turn_id, owner, epoch, started_phase) VALUES ('turn-ghost', 'w', 1, 'prepare')"
        )
        # Then the database takes it (no foreign-key check costs a lookup and a lock per row)...
        found = {r[0]: r[1] for r in await conn.fetch(orphans_sql("brain"))}
    # ...and the query the tests run after every real run finds exactly that one
    assert found["runs.turn_id"] == 1
    assert sum(found.values()) == 1
