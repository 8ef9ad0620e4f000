"""The Brain's store contract, run against PostgreSQL and the embedded SQLite store alike:
durable submit, claims under leases, fenced moves committed whole, the journal, applying events,
liveness. The two backends (one each, behind one interface) must keep it the same, and one test
checks that they leave the same facts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from brain import verbs
from brain.rules import moves
from brain.rules.states import TurnPhase, TurnStatus
from brain.rules.submits import Start, Submit
from brain.store import (
    BrainStore,
    ClaimBudget,
    Claimed,
    Intent,
    Move,
    Moved,
    TurnRow,
    open_brain_store,
    open_store,
    turns_pg,
)
from brain.store.views import Views
from infra.db import dialect, lock_class
from infra.db.sqlite import open_pool
from infra.liveness import Liveness
from infra.liveness.registrations import LocalWorkerRegistration, WorkerRegistration
from infra.transport import Topology
from infra.transport.broker import Broker
from protocol import (
    AcceptedBody,
    AcceptedEvent,
    ConflictError,
    IllegalTransitionError,
    OutputPageBody,
    OutputPageEvent,
    RoutingError,
    StaleOwnerError,
    StartedBody,
    StartedEvent,
    SucceededBody,
    SucceededEvent,
    decode,
)
from tests.support import (
    TableScans,
    TendonEnv,
    crash,
    freeze,
    orphans_sql,
    session_locking,
    sessions_named,
    wait_for,
)

AGENT_DEF = {"name": "a", "version": "1", "model": {"kind": "scripted", "script": [{"content": "hi"}]}}


def _agent(**changes: Any) -> Any:
    from brain.rules.agents import AgentDefinition

    return AgentDefinition.model_validate({**AGENT_DEF, **changes})


AGENT = _agent()


async def _open(kind: str, tendon: TendonEnv, tmp_path: Path) -> BrainStore:
    if kind == "postgres":
        return await open_store(tendon.settings())
    return await open_brain_store(await open_pool(tmp_path / "brain.sqlite3"))


@pytest.fixture(params=["postgres", "sqlite"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, tendon: TendonEnv
) -> AsyncIterator[BrainStore]:
    s = await _open(request.param, tendon, tmp_path)
    yield s
    await s.close()


@pytest.fixture
async def pg_store(tendon: TendonEnv) -> AsyncIterator[BrainStore]:
    s = await open_store(tendon.settings())
    yield s
    await s.close()


@pytest.fixture
def schema(store: BrainStore, tendon: TendonEnv) -> str:
    return tendon.settings().brain_schema if dialect(store.pool) == "postgres" else "brain"


def register(store: BrainStore, schema: str, database_url: str | None = None, **options: Any) -> Liveness:
    """A live worker registration on whichever backend ``store`` is."""
    if dialect(store.pool) == "sqlite":
        return LocalWorkerRegistration(store.pool, "brain", **options)
    assert database_url is not None
    return WorkerRegistration(database_url, schema, "brain", **options)


def releasing(store: BrainStore, schema: str, database_url: str | None = None, **options: Any) -> Liveness:
    """A live Brain registration that judges the others and hands back the turns of the dead."""
    options = {"grace": 0.3, "interval": 0.05, **options}
    options["release"] = lambda conn, gone, died: store.turns.release_owners(conn, gone, "wake", died=died)
    return register(store, schema, database_url, **options)


async def _submit(store: BrainStore, request_id: str = "r1", text: str = "hello", session: str = "s1") -> str:
    turn_id, _ = await verbs.submit(
        store, namespace="ns", session_id=session, request_id=request_id, user_input=text, agent=AGENT,
        wake_channel="wake",
    )  # fmt: skip
    return turn_id


async def _claim(store: BrainStore, owner: str, lease: float = 30.0, limit: int = 1) -> Claimed:
    return await store.transact(lambda c: store.turns.claim(c, owner, lease, limit))


async def _commit(store: BrainStore, *batch: Move) -> list[Moved | None]:
    return await store.transact(lambda c: store.turns.commit_moves(c, list(batch), 30.0))


async def _move(store: BrainStore, move: Move) -> Moved:
    """Commit one move, or raise why it was refused (as a run's committer does)."""

    async def work(conn: Any) -> Moved:
        (moved,) = await store.turns.commit_moves(conn, [move], 30.0)
        if moved is None:
            await store.turns.refuse(conn, move)
        assert moved is not None
        return moved

    return await store.transact(work)


async def _turn(store: BrainStore, turn_id: str) -> TurnRow:
    return await store.read(lambda c: store.turns.load(c, turn_id))


async def _facts(store: BrainStore, session: str = "s1") -> list[tuple[int, list[str]]]:
    entries = await store.read(lambda c: store.journal.entries(c, f"ns/{session}"))
    return [(e.seq, [f["kind"] for f in e.facts]) for e in entries]


def _intent(execution_id: str, route: str = "lab", step: int = 1, call: str = "call-1") -> Intent:
    return Intent(
        execution_id=execution_id, tool_step=step, call_id=call, route=route, tool="echo",
        binding_digest="b" * 64, replay_policy="safe", request_digest="d" * 64,
        command_message_id=f"m-{execution_id}", command=b"{}", queue=Topology("t").commands(route),
    )  # fmt: skip


async def _waiting_on(
    store: BrainStore,
    turn_id: str,
    *execution_ids: str,
    route: str = "lab",
    freeze: dict[str, Any] | None = None,
) -> TurnRow:
    """Take ``turn_id`` to WAIT_TOOLS, its step's executions committed as the given intents (the
    way a run does: claim, prepare (freezing its thread's bindings as ``freeze``), a reply with
    tool calls)."""
    (row,) = (await _claim(store, "brain-test")).rows
    assert row.id == turn_id
    prepared = (await _move(store, moves.prepare(row, freeze=freeze))).row
    calls = [{"call_id": f"call-{i + 1}", "tool": "echo", "args": {}} for i in range(len(execution_ids))]
    intents = [_intent(e, route, call=c["call_id"]) for e, c in zip(execution_ids, calls, strict=True)]
    reply = moves.reply(prepared, {"text": None, "tool_calls": calls}, {}, intents=intents, first_look=60.0)
    return (await _move(store, reply)).row


def _header(execution_id: str, session: str = "s1") -> dict[str, Any]:
    return {
        "execution_id": execution_id,
        "namespace": "ns",
        "session_id": session,
        "request_digest": "d" * 64,
    }


def _events(execution_id: str, result: Any = None, session: str = "s1") -> tuple[Any, Any, Any]:
    h = _header(execution_id, session)
    return (
        AcceptedEvent(seq=1, body=AcceptedBody(worker="w"), **h),
        StartedEvent(seq=2, body=StartedBody(attempt=1, worker="w"), **h),
        SucceededEvent(seq=3, body=SucceededBody(result={"ok": True} if result is None else result), **h),
    )


async def _apply(store: BrainStore, *ranges: list[Any], budget: ClaimBudget | None = None) -> Any:
    return await store.transact(
        lambda c: store.events.apply_events(c, list(ranges), wake_channel="ch", budget=budget)
    )


# ---- submit ---------------------------------------------------------------------------


async def test_the_same_request_id_returns_the_original_turn_and_other_input_conflicts(store):
    first = await _submit(store)
    assert await _submit(store) == first
    with pytest.raises(ConflictError, match="already used for a different input"):
        await _submit(store, text="something else")
    assert await store.pool.fetchval("SELECT count(*) FROM turns") == 1


async def test_a_session_is_pinned_to_its_agent_version_even_for_the_same_request(store):
    first = await _submit(store)
    other = _agent(version="2")
    # A new request in the session with another version, or the same request with it, is refused
    for request_id in ("r2", "r1"):
        with pytest.raises(ConflictError, match="pinned to agent a version 1, not a version 2"):
            await verbs.submit(
                store, namespace="ns", session_id="s1", request_id=request_id, user_input="hello",
                agent=other, wake_channel="wake",
            )  # fmt: skip
    assert await _submit(store) == first
    assert await store.pool.fetchval("SELECT count(*) FROM turns") == 1


async def test_turns_of_one_session_share_its_thread_and_one_journal_sequence(store):
    # Given a first turn, which creates the session and its main thread
    first = await _submit(store, "r1")
    # When a second turn comes in the same session
    second = await _submit(store, "r2", text="and then")
    # Then both are queued on the one thread, and their journal entries continue one sequence,
    # each carrying its turn's request id and input (the user's message, kept once)
    rows = await store.pool.fetch("SELECT id, thread_id, status FROM turns ORDER BY seq")
    assert [(r["id"], r["thread_id"], r["status"]) for r in rows] == [
        (first, "ns/s1", "queued"),  # the store keys a session by its namespace and id
        (second, "ns/s1", "queued"),
    ]
    assert await store.pool.fetchval("SELECT count(*) FROM threads") == 1
    entries = await store.read(lambda c: store.journal.entries(c, "ns/s1"))
    assert [(e.seq, e.turn_id, e.status, e.facts) for e in entries] == [
        (1, first, "queued", [{"kind": "turn.accepted", "request_id": "r1", "input": {"text": "hello"}}]),
        (2, second, "queued", [{"kind": "turn.accepted", "request_id": "r2", "input": {"text": "and then"}}]),
    ]
    assert await store.read(lambda c: store.journal.last_seq(c, "ns/s1")) == 2
    # And another namespace's session of the same id is its own, with its own journal sequence and
    # its own registration of the agent's name and version (here with other content)
    theirs, created = await verbs.submit(
        store, namespace="other", session_id="s1", request_id="r1", user_input="x",
        agent=_agent(instructions="theirs"), wake_channel="wake",
    )  # fmt: skip
    assert created and theirs not in (first, second)
    assert [e.seq for e in await store.read(lambda c: store.journal.entries(c, "other/s1"))] == [1]
    assert await store.read(lambda c: store.journal.last_seq(c, "ns/s1")) == 2


async def test_a_changed_agent_under_the_same_version_is_refused(store):
    await _submit(store)
    with pytest.raises(ConflictError, match="new version"):
        await verbs.submit(
            store, namespace="ns", session_id="s2", request_id="r", user_input="x",
            agent=_agent(instructions="be different"), wake_channel="wake",
        )  # fmt: skip


@pytest.mark.parametrize("session_exists", [False, True])
async def test_concurrent_submits_of_one_request_agree_on_one_turn(pg_store, session_exists):
    # PostgreSQL only (SQLite has one writer at a time). Given eight submits of one request id
    # racing in eight transactions, half of them with another input
    store = pg_store
    if session_exists:
        await _submit(store, request_id="earlier")

    async def submit(text: str) -> str | Exception:
        try:
            return await _submit(store, "same", text)
        except Exception as exc:  # noqa: BLE001 - what each caller got is the point
            return exc

    texts = ["one", "other"] * 4
    answers = await asyncio.gather(*(submit(t) for t in texts))
    # Then one turn exists; callers with its input got it, the others a ConflictError, and no
    # caller saw a unique-constraint error
    (turn,) = await store.pool.fetch("SELECT id FROM turns WHERE request_id = 'same'")
    entries = await store.read(lambda c: store.journal.entries(c, "ns/s1", turn_id=turn["id"]))
    text = entries[0].facts[0]["input"]["text"]
    for sent, answer in zip(texts, answers, strict=True):
        if sent == text:
            assert answer == turn["id"]
        else:
            assert isinstance(answer, ConflictError), answer


# ---- claims and moves -----------------------------------------------------------------


async def test_a_claim_takes_several_turns_in_one_statement_and_says_whether_more_were_claimable(store):
    # Given three claimable turns in three sessions
    submitted = {await _submit(store, session=f"s{i}") for i in range(3)}
    # When one claim takes up to two, it says another is waiting; the claim of the last says none is
    two = await _claim(store, "b1", limit=2)
    last = await _claim(store, "b1", limit=2)
    assert len(two.rows) == 2 and two.more and len(last.rows) == 1 and not last.more
    # (the third was looked at, and locked, by the first claim: it was not taken)
    assert {r.id for r in two.rows + last.rows} == submitted
    assert {(r.status, r.lease_owner, r.lease_epoch, r.runs) for r in two.rows + last.rows} == {
        (TurnStatus.RUNNING, "b1", 1, 1)
    }
    # and a turn under a live lease is never claimed again
    assert (await _claim(store, "b2", limit=5)).rows == []


async def test_a_claim_that_takes_every_claimable_turn_says_none_is_left(store):
    submitted = {await _submit(store, session=f"s{i}") for i in range(2)}
    every = await _claim(store, "b1", limit=2)
    assert {r.id for r in every.rows} == submitted and not every.more


async def test_a_claim_and_its_prepare_are_one_journal_entry_of_the_run(store):
    turn_id = await _submit(store)
    (row,) = (await _claim(store, "b1")).rows
    moved = await _move(store, moves.prepare(row, freeze={"echo": {"name": "echo"}}))
    assert moved.froze and moved.row.phase is TurnPhase.MODEL_REQUEST and moved.seq == 2
    (entry,) = [e for e in await store.read(lambda c: store.journal.entries(c, "ns/s1")) if e.seq == 2]
    assert (entry.turn_id, entry.run, entry.status, entry.phase) == (turn_id, 1, "running", "model_request")
    assert entry.facts == [
        {"kind": "turn.run_started", "run": 1, "epoch": 1, "phase": "prepare", "owner": "b1"},
        {"kind": "turn.prepared"},
    ]
    thread = await store.read(lambda c: store.bindings.thread(c, "ns/s1"))
    assert thread["bindings"] == {"echo": {"name": "echo"}}


async def test_a_stale_owner_cannot_commit_and_nothing_of_its_move_remains(store):
    turn_id = await _submit(store)
    (a,) = (await _claim(store, "a")).rows
    # Given A's lease expired and B took the turn over with a new epoch
    await store.pool.execute("UPDATE turns SET lease_expires_at = ts_add(now(), -1)")
    (b,) = (await _claim(store, "b")).rows
    assert b.lease_epoch == a.lease_epoch + 1
    # When A commits its prepare and a reply with an intent, Then each is refused whole
    with pytest.raises(StaleOwnerError):
        await _move(store, moves.prepare(a, freeze={"echo": {}}))
    fake = replace(a, phase=TurnPhase.MODEL_REQUEST)
    reply = moves.reply(
        fake, {"text": None, "tool_calls": [{"call_id": "c"}]}, {}, intents=[_intent("x")], first_look=1
    )
    with pytest.raises(StaleOwnerError):
        await _move(store, reply)
    assert await store.pool.fetchval("SELECT count(*) FROM executions") == 0
    assert await _facts(store) == [(1, ["turn.accepted"])]
    row = await _turn(store, turn_id)
    assert (row.phase, row.lease_owner) == (TurnPhase.PREPARE, "b")
    assert (await store.read(lambda c: store.bindings.thread(c, "ns/s1")))["bindings"] is None


async def test_moves_of_many_turns_commit_together_and_a_refused_one_writes_nothing(store):
    # Given two claimed turns, one of which another run then took over
    one, two = await _submit(store, session="s1"), await _submit(store, session="s2")
    rows = {r.id: r for r in (await _claim(store, "b1", limit=2)).rows}
    await store.pool.execute("UPDATE turns SET lease_epoch = lease_epoch + 1 WHERE id = $1", two)
    # When both prepares commit in one batch
    moved = await _commit(store, moves.prepare(rows[one], freeze=None), moves.prepare(rows[two], freeze=None))
    # Then the first moved (with its entry), the other is refused with nothing written
    assert moved[0] is not None and moved[0].row.phase is TurnPhase.MODEL_REQUEST and moved[1] is None
    assert [kinds for _, kinds in await _facts(store, "s2")] == [["turn.accepted"]]
    assert (await _turn(store, two)).phase is TurnPhase.PREPARE


async def test_a_move_the_tables_forbid_cannot_even_be_made(store):
    await _submit(store)
    (row,) = (await _claim(store, "a")).rows
    # A run can neither jump from PREPARE back to nothing, nor complete a waiting turn
    with pytest.raises(IllegalTransitionError, match="turn phase cannot move from apply_results to prepare"):
        Move(
            before=replace(row, phase=TurnPhase.APPLY_RESULTS),
            status=TurnStatus.RUNNING,
            phase=TurnPhase.PREPARE,
        )
    with pytest.raises(IllegalTransitionError, match="turn cannot move from waiting to completed"):
        Move(
            before=replace(row, status=TurnStatus.WAITING), status=TurnStatus.COMPLETED, phase=TurnPhase.DONE
        )
    with pytest.raises(IllegalTransitionError):
        moves.finalize(row, {"text": "no"})  # PREPARE -> DONE is no step of the table
    # and what the rules allow still works
    moved = await _move(store, moves.prepare(row, freeze=None))
    assert (moved.row.phase, moved.row.revision) == (TurnPhase.MODEL_REQUEST, row.revision + 1)


async def test_a_claim_that_meets_a_turn_claimed_since_its_snapshot_leaves_it_to_the_new_owner(pg_store):
    # PostgreSQL only (overlapping statements). Given a queued turn, and a claim whose scan saw
    # it free but which reaches it only after another claim committed (the scan is made slow
    # here to open that window for sure; under load it opens by itself)
    store = pg_store
    turn_id = await _submit(store)
    slow_claim = turns_pg._CLAIM.replace(
        "WHERE t.status IN", "WHERE pg_sleep(0.3) IS NOT NULL AND t.status IN", 1
    )
    async with store.pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        claiming = asyncio.create_task(conn.fetch(slow_claim, "late", 30.0, 1))
        await asyncio.sleep(0.1)  # the late claim has its snapshot and is scanning
        (first,) = (await _claim(store, "first")).rows
        # When the late claim gets to the row
        taken = await asyncio.wait_for(claiming, 10)
        await tx.rollback()
    # Then it takes nothing: the turn stays with its live owner
    assert taken == []
    row = await _turn(store, turn_id)
    assert (row.lease_owner, row.lease_epoch) == ("first", first.lease_epoch)


async def test_concurrent_claims_never_take_a_turn_from_a_live_owner(pg_store):
    # PostgreSQL only. Given 30 turns and 8 claimers of one live Brain that each hold turns for
    # a moment and then give them back (as a run that waits does)
    store = pg_store
    for i in range(80):
        await _submit(store, session=f"s{i}")
    fenced: list[str] = []
    claims = 0

    async def claimer(until: float) -> None:
        nonlocal claims
        while asyncio.get_running_loop().time() < until:
            got = (await _claim(store, "brain", limit=2)).rows
            if not got:
                await asyncio.sleep(0.001)
                continue
            claims += len(got)
            await asyncio.sleep(0.002)
            back = [moves.retry(r, retries=0, delay=0.0, error="") for r in got]
            fenced.extend(
                m.before.id for m, done in zip(back, await _commit(store, *back), strict=True) if done is None
            )

    # When they claim for a few seconds (bounded)
    until = asyncio.get_running_loop().time() + 4
    await asyncio.wait_for(asyncio.gather(*(claimer(until) for _ in range(8))), 30)
    # Then every claim found its turns free: no owner lost one it held
    assert claims > 100
    assert fenced == []


# ---- liveness -------------------------------------------------------------------------


async def _claimable(store: BrainStore) -> bool:
    return await store.turns.anything_claimable()


async def test_a_killed_owner_is_taken_over_after_the_grace_not_its_lease(pg_store, tendon):
    # Given a turn claimed under a one-hour lease by a Brain that is then killed (SQLite: see the
    # test of an earlier opening of the file, the only way a worker dies there)
    store, schema = pg_store, tendon.settings().brain_schema
    turn_id = await _submit(store)
    async with register(store, schema, tendon.database_url) as a:
        await _claim(store, a.worker_id, 3600)
        crash(a)
    # When another Brain judges (once it has been up for its grace)
    async with releasing(store, schema, tendon.database_url) as c:
        assert not await _claimable(store)
        await wait_for(lambda: _claimable(store), timeout=10, what="the dead owner's turn handed back")
        # Then the dead owner is recorded as such, and the turn goes to a new run, epoch 2
        assert await store.pool.fetchval("SELECT dead_at IS NOT NULL FROM workers WHERE id = $1", a.worker_id)
        (claimed,) = (await _claim(store, c.worker_id)).rows
        assert (claimed.id, claimed.lease_epoch, claimed.runs) == (turn_id, 2, 2)


async def test_a_frozen_owner_is_presumed_dead_once_its_lease_ran_out(pg_store, tendon):
    # PostgreSQL (the lock outlives a frozen process there). Given a Brain whose keeper stops
    # renewing (frozen) while its session, and so its lock, live on
    store, schema = pg_store, tendon.settings().brain_schema
    turn_id = await _submit(store)
    async with register(store, schema, tendon.database_url, lease_seconds=1.0) as frozen:
        await _claim(store, frozen.worker_id, 3600)
        assert frozen._keeper is not None
        frozen._keeper.cancel()
        async with releasing(store, schema, tendon.database_url) as judge:
            # Then its turn is handed back once its lease ran out, though its lock is held
            await wait_for(lambda: _claimable(store), timeout=10, what="the frozen owner's turn")
            assert (await _turn(store, turn_id)).lease_owner is None
            # and when it wakes, its keeper finds its session ended with its death and, connected
            # again, its renewal finds it dead: it must stop (``lost``)
            await frozen.step()
            assert frozen.lost.is_set()
            assert (await _claim(store, judge.worker_id)).rows


async def test_a_dead_brains_sessions_are_ended_so_a_turn_row_it_still_locks_is_handed_back(pg_store, tendon):
    # Given a Brain holding a turn that freezes while one of its sessions holds the turn's row
    # locked mid-transaction (between a statement's parse and bind: not idle, so no timeout ends it)
    store, schema = pg_store, tendon.settings().brain_schema
    turn_id = await _submit(store)
    lock = "SELECT id FROM turns WHERE id = $1 FOR UPDATE"
    async with register(store, schema, tendon.database_url, lease_seconds=1.0) as frozen:
        await _claim(store, frozen.worker_id, 3600)
        freeze(frozen)
        async with session_locking(tendon.database_url, schema, frozen.worker_id, lock, turn_id):
            # When another Brain judges it dead once its lease ran out
            async with releasing(store, schema, tendon.database_url):
                # Then the judgement completes in bounded time: its sessions are ended first, so
                # the turn is handed back instead of waiting on the row lock forever
                await wait_for(lambda: _claimable(store), timeout=15, what="the turn handed back")
                assert (await _turn(store, turn_id)).lease_owner is None
                assert await sessions_named(store.pool, frozen.worker_id) == 0


async def test_a_lost_liveness_connection_taken_again_within_the_grace_keeps_the_work(pg_store, tendon):
    # Given a Brain holding a turn, and another that judges every 50 ms
    store, schema = pg_store, tendon.settings().brain_schema
    turn_id = await _submit(store)
    async with (
        register(store, schema, tendon.database_url, grace=3.0, interval=0.05) as owner,
        releasing(store, schema, tendon.database_url, grace=3.0) as judge,
    ):
        await _claim(store, owner.worker_id, 3600)
        await wait_for(lambda: _settled(judge), timeout=10, what="the judge to settle")
        # When the owner's liveness session is ended under it (a cut connection, a restart)
        ended = await store.pool.fetchval(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid = $1::oid AND objid = $2::oid",
            lock_class(schema),
            await store.pool.fetchval("SELECT lock_key FROM workers WHERE id = $1", owner.worker_id),
        )
        assert ended
        # Then it connects again and takes its lock back in time: nobody presumes it dead
        await wait_for(
            lambda: _holds_lock(store, schema, owner.worker_id), timeout=10, what="the lock taken again"
        )
        await asyncio.sleep(0.5)  # several judgements later
        assert not owner.lost.is_set()
        row = await store.pool.fetchrow(
            "SELECT dead_at, lock_lost_at FROM workers WHERE id = $1", owner.worker_id
        )
        assert row["dead_at"] is None and row["lock_lost_at"] is None
        assert (await _turn(store, turn_id)).lease_owner == owner.worker_id
        assert judge.worker_id != owner.worker_id


async def _settled(registration: Liveness) -> bool:
    return registration.settled


async def _holds_lock(store: BrainStore, schema: str, worker_id: str) -> bool:
    return bool(
        await store.pool.fetchval(
            """SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN workers w ON l.objid = w.lock_key::oid
                WHERE w.id = $1 AND l.locktype = 'advisory' AND l.granted AND l.classid = $2::oid)""",
            worker_id,
            lock_class(schema),
        )
    )


async def test_a_lost_lock_whose_process_the_broker_no_longer_sees_is_a_death_at_once(pg_store, tendon):
    # Given a Brain holding a turn, announced on the broker, and a judge that would otherwise give
    # a lost lock 30 s to come back
    store, schema = pg_store, tendon.settings().brain_schema
    turn_id = await _submit(store)
    topology = Topology(tendon.prefix)
    async with (
        Broker(tendon.amqp_url, topology) as mine,
        Broker(tendon.amqp_url, topology) as theirs,
        register(store, schema, tendon.database_url, presence=mine) as owner,
        releasing(store, schema, tendon.database_url, grace=30.0, interval=0.05, presence=theirs) as judge,
    ):
        await _claim(store, owner.worker_id, 3600)
        assert await theirs.present(topology.presence(owner.worker_id))
        await wait_for(lambda: _settled(judge), timeout=10, what="the judge to settle")
        # When only its database session ends (its connection cut, its process still there)
        crash(owner)
        await asyncio.sleep(1.0)  # many judgements
        # Then it is not presumed dead: the broker still sees it, the grace is its to use
        assert not await _claimable(store)
        # When its broker connection ends too (the process is gone)
        await mine.__aexit__(None, None, None)
        # Then it is dead at once, not after the 30 s grace
        await wait_for(lambda: _claimable(store), timeout=10, what="the turn handed back")
        assert (await _turn(store, turn_id)).lease_owner is None


async def test_a_stopping_brain_hands_its_turns_back_at_once(store, schema, tendon):
    turn_id = await _submit(store)
    async with releasing(store, schema, tendon.database_url) as a:
        await _claim(store, a.worker_id, 3600)
        assert not await _claimable(store)
    # Leaving the block retired it: dead now, its turn claimable without any wait
    assert await _claimable(store)
    assert await store.pool.fetchval("SELECT dead_at IS NOT NULL FROM workers WHERE id = $1", a.worker_id)
    assert (await _turn(store, turn_id)).lease_owner is None


async def test_dead_workers_rows_are_pruned_after_a_while(store, schema, tendon):
    async with releasing(store, schema, tendon.database_url) as a:
        pass
    async with releasing(store, schema, tendon.database_url, interval=0.05, grace=0.05) as judge:
        await store.pool.execute(
            "UPDATE workers SET dead_at = ts_add(now(), -7200) WHERE id = $1", a.worker_id
        )

        async def pruned() -> bool:
            return await store.pool.fetchval("SELECT count(*) FROM workers WHERE id = $1", a.worker_id) == 0

        await wait_for(pruned, timeout=10, what="the dead worker's row pruned")
        assert await store.pool.fetchval("SELECT count(*) FROM workers WHERE id = $1", judge.worker_id) == 1


async def test_on_sqlite_the_workers_of_an_earlier_opening_of_the_file_are_dead_at_once(tmp_path):
    first = await open_brain_store(await open_pool(tmp_path / "brain.sqlite3"))
    await _submit(first)
    async with LocalWorkerRegistration(first.pool, "brain") as a:
        await _claim(first, a.worker_id, 3600)
        crash(a)
    await first.close()  # the process "dies": its one-hour lease must not protect the turn
    second = await open_brain_store(await open_pool(tmp_path / "brain.sqlite3"))
    try:
        async with releasing(second, "brain") as b:
            await wait_for(lambda: _claimable(second), timeout=10, what="the turn handed back")
            (claimed,) = (await _claim(second, b.worker_id)).rows
            assert claimed.lease_epoch == 2
            assert (await _claim(second, "other")).rows == []
    finally:
        await second.close()


# ---- applying events ------------------------------------------------------------------


@pytest.mark.parametrize("detailed", [False, True])
async def test_events_apply_once_in_order_whatever_order_they_arrive_in(store, detailed):
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "e1")
    if detailed:
        await store.pool.execute("UPDATE executions SET journal_detail = true")
    accepted, started, done = _events("e1")

    await _apply(store, [done])  # ahead of a gap: held
    await _apply(store, [accepted])
    await _apply(store, [accepted], [done])  # a duplicate, and a second copy of a held event
    assert await store.pool.fetchval("SELECT count(*) FROM held_events") == 1
    row = await store.pool.fetchrow("SELECT status, last_seq, holding FROM executions WHERE id = 'e1'")
    assert (row["status"], row["last_seq"], row["holding"]) == ("accepted", 1, True)
    await _apply(store, [started])  # fills the gap: the held one drains after it
    row = await store.pool.fetchrow(
        "SELECT status, last_seq, result, holding FROM executions WHERE id = 'e1'"
    )
    assert (row["status"], row["last_seq"], row["result"], row["holding"]) == (
        "succeeded",
        3,
        {"ok": True},
        False,
    )
    assert await store.pool.fetchval("SELECT count(*) FROM held_events") == 0
    # What the journal records of it: its outcome (and, for agents that ask, every step)
    kinds = [k for _, ks in await _facts(store) for k in ks if k.startswith("execution.")]
    expected = ["execution.intended", "execution.succeeded"]
    assert kinds == (["execution.intended", "execution.accepted", "execution.running", "execution.succeeded"]
                     if detailed else expected)  # fmt: skip


async def test_a_range_of_events_in_one_message_applies_as_one_change(store):
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "e1")
    applied = await _apply(store, list(_events("e1")))
    assert applied.refused == [None] and applied.woken == 1
    row = await store.pool.fetchrow(
        "SELECT status, last_seq, attempts, result FROM executions WHERE id = 'e1'"
    )
    assert (row["status"], row["last_seq"], row["attempts"], row["result"]) == (
        "succeeded",
        3,
        1,
        {"ok": True},
    )
    turn = await _turn(store, turn_id)
    assert (turn.status, turn.phase, turn.lease_owner) == (TurnStatus.RUNNING, TurnPhase.WAIT_TOOLS, None)


async def test_an_event_from_another_session_is_refused_and_the_rest_of_its_batch_applies(store):
    first, second = await _submit(store, session="s1"), await _submit(store, session="s2")
    await _waiting_on(store, first, "e2")
    await store.pool.execute("UPDATE turns SET lease_owner = NULL")
    await _waiting_on(store, second, "e3")
    forged = AcceptedEvent(seq=1, body=AcceptedBody(worker="w"), **{**_header("e2"), "session_id": "other"})
    fine = AcceptedEvent(seq=1, body=AcceptedBody(worker="w"), **{**_header("e3"), "session_id": "s2"})
    applied = await _apply(store, [forged], [fine])
    assert isinstance(applied.refused[0], RoutingError) and "belongs to ns/s1" in str(applied.refused[0])
    assert applied.refused[1] is None
    rows = dict(await store.pool.fetch("SELECT id, status FROM executions ORDER BY id"))
    assert rows == {"e2": "intended", "e3": "accepted"}


async def test_a_step_completed_by_an_apply_is_claimed_there_for_a_run_with_a_free_slot(store):
    # Given a turn waiting on two executions, one of which finished before
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "e1", "e2")
    await _apply(store, list(_events("e1", result=1)))
    assert (await _turn(store, turn_id)).status is TurnStatus.WAITING
    # When the last one's outcome is applied by a Brain with a free run slot
    budget = ClaimBudget("me", 30.0, 1)
    applied = await _apply(store, list(_events("e2", result=2)), budget=budget)
    # Then the turn is claimed for that Brain's run in the same commit, past APPLY_RESULTS, and its
    # entry says so: the outcome, a new run, and which executions' results the model sees next
    (claimed,) = applied.claimed
    assert applied.claimed_by == [[claimed]] and budget.left == 0
    assert (claimed.id, claimed.status, claimed.phase, claimed.lease_owner, claimed.lease_epoch) == (
        turn_id, TurnStatus.RUNNING, TurnPhase.MODEL_REQUEST, "me", 2
    )  # fmt: skip
    last = (await store.read(lambda c: store.journal.entries(c, "ns/s1")))[-1]
    assert (last.status, last.phase, last.run) == ("running", "model_request", 2)
    assert [f["kind"] for f in last.facts] == [
        "execution.succeeded",
        "turn.run_started",
        "turn.results_applied",
    ]
    assert last.facts[-1]["executions"] == ["e1", "e2"]


async def test_a_lost_wake_up_is_repaired_by_the_periodic_scan(store):
    # Given a turn parked WAITING whose only execution finished, but whose wake-up was lost
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "e3")
    await store.pool.execute("UPDATE executions SET status = 'succeeded' WHERE id = 'e3'")
    await store.pool.execute("UPDATE turns SET wake_at = ts_add(now(), -1)")
    # When the repair scan runs, Then the turn is claimable again
    assert await store.transact(lambda c: store.repairs.wake_stuck(c, "ch")) == 1
    assert (await _turn(store, turn_id)).status is TurnStatus.RUNNING
    # and a turn still waiting on a running tool is left alone
    await store.pool.execute("UPDATE executions SET status = 'running' WHERE id = 'e3'")
    await store.pool.execute("UPDATE turns SET status = 'waiting', wake_at = ts_add(now(), -1)")
    assert await store.transact(lambda c: store.repairs.wake_stuck(c, "ch")) == 0


async def test_two_sibling_executions_finishing_at_once_wake_their_turn(pg_store):
    # PostgreSQL only: SQLite runs one write transaction at a time, siblings cannot overlap.
    store = pg_store
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "sib1", "sib2")
    for e in ("sib1", "sib2"):
        await _apply(store, list(_events(e))[:2])

    # When both results are applied in overlapping transactions
    async with store.pool.acquire() as first:
        tx = first.transaction()
        await tx.start()
        await store.events.apply_events(first, [[_events("sib1", 1)[2]]], wake_channel="ch", budget=None)
        second = asyncio.create_task(_apply(store, [_events("sib2", 2)[2]]))
        await asyncio.sleep(0.3)
        # Then the second waits for the first (the turn's lock) ...
        assert not second.done()
        await tx.commit()
    assert (await asyncio.wait_for(second, 10)).woken == 1
    # ... and, seeing its sibling's committed result, wakes the turn
    assert (await _turn(store, turn_id)).status is TurnStatus.RUNNING


async def test_a_replay_that_brings_a_held_event_again_in_one_batch_leaves_nothing_held(store):
    # Given a tool that wrote two output pages and runs on: its first page (seq 3) was lost on the
    # way, so the Brain holds the second (seq 4) behind the gap
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "e7")
    accepted, started, _ = _events("e7")
    h = _header("e7")
    page = [
        OutputPageEvent(seq=s, body=OutputPageBody(offset=o, data="x" * 10), **h)
        for s, o in ((3, 0), (4, 10))
    ]
    await _apply(store, [accepted, started])
    await _apply(store, [page[1]])
    assert await store.pool.fetchval("SELECT holding FROM executions WHERE id = 'e7'")

    # When the Hands answer the replay request with seqs 3 and 4 in one batch
    await _apply(store, page)

    # Then both are applied, and nothing is held any more: the gap scan has nothing to ask for
    row = await store.pool.fetchrow("SELECT status, last_seq, holding FROM executions WHERE id = 'e7'")
    assert (row["status"], row["last_seq"], row["holding"]) == ("running", 4, False)
    assert await store.pool.fetchval("SELECT count(*) FROM held_events") == 0
    async with store.pool.acquire() as conn:
        assert await store.repairs.gaps_to_replay(conn, 0.0) == []
    # and the tool's end applies as the next seq, leaving no orphan behind
    done = SucceededEvent(seq=5, body=SucceededBody(result={"ok": True}), **h)
    await _apply(store, [done])
    assert await store.pool.fetchval("SELECT status FROM executions WHERE id = 'e7'") == "succeeded"
    assert await store.pool.fetchval("SELECT count(*) FROM held_events") == 0


async def _recorded_dead(store: BrainStore, worker_id: str) -> None:
    """A Brain the others judged dead (its turns handed back), which may not know it yet."""
    await store.pool.execute(
        "INSERT INTO workers (id, kind, lock_key, dead_at) VALUES ($1, 'brain', 0, now())", worker_id
    )


async def test_a_brain_recorded_dead_claims_nothing_when_it_wakes(store):
    # Given a queued turn, and a Brain the others recorded dead while it was frozen
    turn_id = await _submit(store)
    await _recorded_dead(store, "brain-zombie")

    # When it wakes and claims (before its liveness tells it what happened)
    claimed = await _claim(store, "brain-zombie", limit=5)

    # Then it takes nothing, and says there is nothing more for it: a live Brain claims the turn
    assert (claimed.rows, claimed.more) == ([], False)
    (row,) = (await _claim(store, "brain-live")).rows
    assert (row.id, row.lease_owner) == (turn_id, "brain-live")


async def test_an_apply_by_a_brain_recorded_dead_wakes_the_turn_without_claiming_it(store):
    # Given a turn that waits on its tool, and a Brain recorded dead that held the tool's outcome
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "z1")
    await store.pool.execute(
        "UPDATE turns SET lease_owner = NULL, lease_expires_at = NULL WHERE id = $1", turn_id
    )
    await _recorded_dead(store, "brain-zombie")

    # When it applies the outcome with room for a run of its own
    applied = await _apply(store, list(_events("z1")), budget=ClaimBudget("brain-zombie", 30.0, 4))

    # Then the turn is woken for any Brain to claim, not claimed for the dead one
    assert applied.claimed == [] and applied.woken == 1
    row = await store.pool.fetchrow("SELECT status, lease_owner FROM turns WHERE id = $1", turn_id)
    assert (row["status"], row["lease_owner"]) == ("running", None)
    assert [r.id for r in (await _claim(store, "brain-live")).rows] == [turn_id]


async def test_a_served_submit_by_a_brain_recorded_dead_leaves_its_turn_queued(store):
    # Given a Brain recorded dead that still serves a submit it received before its freeze
    await _recorded_dead(store, "brain-zombie")
    asked = Submit(
        namespace="ns", session_id="s9", request_id="r", user_input="hi", agent=AGENT, wake_channel="wake"
    )

    # When it offers to start the turn in the submit's commit
    done = await store.submits.submit_served(asked, Start("brain-zombie", 30.0, {}))

    # Then the turn is accepted but not started: queued, for a live Brain to claim
    assert done.created and done.started is None
    assert await store.pool.fetchval("SELECT status FROM turns WHERE id = $1", done.turn_id) == "queued"


async def test_an_event_applied_while_a_later_one_is_being_held_drains_it(pg_store):
    # PostgreSQL only (overlapping transactions). Given an accepted execution (seq 1)
    store = pg_store
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "h1")
    accepted, started, done = _events("h1")
    await _apply(store, [accepted])
    # When seq 3 is being held by one transaction while another applies seq 2
    async with store.pool.acquire() as holder:
        tx = holder.transaction()
        await tx.start()
        await store.events.apply_events(holder, [[done]], wake_channel="ch", budget=None)
        applying = asyncio.create_task(_apply(store, [started]))
        await asyncio.sleep(0.3)
        assert not applying.done()  # it waits for the turn and the execution
        await tx.commit()
    await asyncio.wait_for(applying, 10)
    # Then the one applying seq 2 saw the hold and applied seq 3 after it: nothing left held
    row = await store.pool.fetchrow("SELECT status, last_seq, holding FROM executions WHERE id = 'h1'")
    assert (row["status"], row["last_seq"], row["holding"]) == ("succeeded", 3, False)
    assert await store.pool.fetchval("SELECT count(*) FROM held_events") == 0


@pytest.mark.parametrize("result", ["plain text", 42, None, [1, "two"], {"ok": True}, True])
async def test_a_result_of_any_json_type_reads_back_as_it_was_sent(store, result):
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "e4")
    await _apply(store, list(_events("e4", result=result)) if result is not None else list(_events("e4"))[:2])
    if result is None:
        h = _header("e4")
        await _apply(store, [SucceededEvent(seq=3, body=SucceededBody(result=None), **h)])
    row = await store.pool.fetchrow("SELECT result FROM executions WHERE id = 'e4'")
    assert row["result"] == result and type(row["result"]) is type(result)


@pytest.mark.parametrize("result", ["plain text", 42, [1, "two"], {"ok": True, "n": 1.5}])
async def test_a_turns_view_reads_its_row_entries_and_executions_as_the_portable_reads_do(store, result):
    # Given a turn whose tool succeeded with a result of some JSON type
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "e6")
    await _apply(store, list(_events("e6", result=result)))

    # When it is read as a description reads it (one statement on PostgreSQL)
    view = await store.read(lambda c: store.views.turn_view(c, "ns", turn_id))

    # Then it is what the backend-neutral reads (three statements) find, typed alike
    portable = await store.read(lambda c: Views(store).turn_view(c, "ns", turn_id))
    assert view == portable and view is not None
    assert view.turn.id == turn_id and view.turn.status is TurnStatus.RUNNING
    assert [e.seq for e in view.entries] == [seq for seq, _ in await _facts(store)]
    assert [(x["id"], x["status"], x["result"]) for x in view.executions] == [("e6", "succeeded", result)]
    assert view.entries[0].facts[0]["kind"] == "turn.accepted"
    # and another namespace's caller finds no such turn
    assert await store.read(lambda c: store.views.turn_view(c, "other", turn_id)) is None


# ---- failing a turn, repairs ----------------------------------------------------------


async def test_a_turn_failed_from_outside_settles_its_open_executions_and_tells_their_hands(store):
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "e5", "e6")
    await _apply(store, list(_events("e5")))
    settled = await store.transact(
        lambda c: store.failures.fail_turn(
            c, turn_id, {"code": "no_answer", "message": "silent"}, Topology("t")
        )
    )
    assert settled is not None and [c.queue for c in settled.controls] == ["t.lab.controls"]
    row = await _turn(store, turn_id)
    assert row.status is TurnStatus.FAILED and row.error["code"] == "no_answer" and row.lease_epoch == 2
    statuses = dict(await store.pool.fetch("SELECT id, status FROM executions ORDER BY id"))
    assert statuses == {"e5": "succeeded", "e6": "cancelled"}
    assert [c.message_id for c in await store.read(store.outbox.unpublished_controls)] == [
        settled.controls[0].message_id
    ]
    # (its step's calls closed first: the thread's next model call sees both outcomes)
    assert (await _facts(store))[-1][1] == ["turn.results_applied", "turn.failed", "execution.cancelled"]
    # A late outcome of the settled one is kept beside it, its status unchanged
    await _apply(store, list(_events("e6")))
    late = await store.pool.fetchrow("SELECT status, error FROM executions WHERE id = 'e6'")
    assert (
        late["status"] == "cancelled"
        and "afterwards its Hands reported it succeeded" in late["error"]["message"]
    )
    assert (await _facts(store))[-1][1] == ["execution.reported_late"]
    # and failing it again does nothing
    assert (
        await store.transact(
            lambda c: store.failures.fail_turn(c, turn_id, {"code": "x", "message": ""}, Topology("t"))
        )
        is None
    )


async def test_a_waiting_turn_is_looked_at_when_its_time_came_with_its_open_executions(store):
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "e7", "e8")
    await _apply(store, list(_events("e8")))
    assert (
        await store.transact(lambda c: store.repairs.due_waiting(c)) == []
    )  # its first look is a minute away
    await store.pool.execute("UPDATE turns SET wake_at = ts_add(now(), -1)")
    due = await store.transact(lambda c: store.repairs.due_waiting(c))
    assert [(r["turn_id"], r["id"], r["status"], r["creator_alive"]) for r in due] == [
        (turn_id, "e7", "intended", False)  # "brain-test" never registered: not alive
    ]
    assert bytes(due[0]["command"]) == b"{}" and due[0]["command_message_id"] == "m-e7"
    await store.transact(lambda c: store.repairs.look_later(c, {turn_id: 60.0}))
    assert await store.transact(lambda c: store.repairs.due_waiting(c)) == []


async def test_a_nudge_is_counted_and_spaces_the_next_one_and_progress_resets_it(store):
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "e9")
    for backoff in (2, 4):
        await store.transact(lambda c: store.repairs.mark_nudged(c, "e9"))
        row = await store.pool.fetchrow("SELECT nudges, stall_backoff FROM executions WHERE id = 'e9'")
        assert (row["nudges"], row["stall_backoff"]) == (backoff // 2, backoff)
    await _apply(store, [_events("e9")[0]])
    row = await store.pool.fetchrow(
        "SELECT nudges, stall_backoff, replay_requested_at FROM executions WHERE id = 'e9'"
    )
    assert (row["nudges"], row["stall_backoff"], row["replay_requested_at"]) == (0, 1, None)


# ---- the record -----------------------------------------------------------------------


async def test_both_backends_leave_the_same_facts(tendon, tmp_path):
    """The same submits, claim, moves, applied events and failure leave the same journal and the
    same turn and execution rows on each backend (ids, times and lease owners aside)."""

    async def story(store: BrainStore) -> Any:
        turn_id = await _submit(store)
        other = await _submit(store, session="s2")
        await _waiting_on(store, turn_id, "x1", "x2")
        await _apply(store, list(_events("x1", result=[1, {"a": None}])))
        await _apply(store, [_events("x2")[2]])  # held behind a gap
        await store.transact(
            lambda c: store.failures.fail_turn(c, other, {"code": "c", "message": "m"}, Topology("t"))
        )
        # A message's id holds its turn's, which differs from one backend to the other
        entries = [
            (
                e.seq,
                e.status,
                e.phase,
                e.run,
                [f | {"message_id": f["message_id"][-3:]} if "message_id" in f else f for f in e.facts],
            )  # fmt: skip
            for s in ("ns/s1", "ns/s2")
            for e in await store.read(lambda c, s=s: store.journal.entries(c, s))
        ]
        turns = [
            (t["status"], t["phase"], t["revision"], t["lease_epoch"], t["runs"], t["tool_step"], t["error"])
            for t in await store.pool.fetch("SELECT * FROM turns ORDER BY seq")
        ]
        executions = [
            (e["id"], e["status"], e["last_seq"], e["result"], e["holding"], bool(e["command"]))
            for e in await store.pool.fetch("SELECT * FROM executions ORDER BY id")
        ]
        return entries, turns, executions

    pg, lite = await _open("postgres", tendon, tmp_path), await _open("sqlite", tendon, tmp_path)
    try:
        on_pg, on_lite = await story(pg), await story(lite)
    finally:
        await pg.close()
        await lite.close()
    for a, b in zip(on_pg, on_lite, strict=True):
        assert a == b


async def test_the_store_checks_no_foreign_keys_and_the_orphan_query_sees_what_they_would(store):
    # Given a turn, and a journal entry written for a turn that does not exist (a bug would do it)
    await _submit(store)
    await store.pool.execute(
        "INSERT INTO journal (session_id, seq, turn_id, facts) VALUES ('ns/s1', 99, 'turn-ghost', $1)",
        [{"kind": "x"}],
    )
    # Then the database takes it (no foreign-key check costs a lookup and a lock per row)...
    found = {r[0]: r[1] for r in await store.pool.fetch(orphans_sql("brain"))}
    # ...and the query the tests run after every real run finds exactly that one
    assert found["journal.turn_id"] == 1
    assert sum(found.values()) == 1


async def test_an_applied_event_rewrites_its_execution_in_its_page_where_no_index_is_written(pg_store):
    # Executions keep a quarter of each page free (migration 0012): an apply's new row version
    # fits beside the old one, a HOT update that writes no index entry. On full pages it moved.
    async with pg_store.pool.acquire() as conn:
        await conn.executemany(
            "INSERT INTO executions (id, turn_id, tool_step, call_id, route, tool, binding_digest,"
            " replay_policy, request_digest, status)"
            " VALUES ($1, 't', 0, $1, 'r', 'tool', 'b', 'none', 'd', 'accepted')",
            [(f"x{i:03}",) for i in range(300)],
        )
        page_of = "SELECT (ctid::text::point)[0] FROM executions WHERE id = $1"
        first = [await conn.fetchval(page_of, f"x{i:03}") for i in (0, 1)]
        await conn.execute(
            "UPDATE executions SET status = 'succeeded', last_seq = 3, result = '{\"ok\": true}',"
            " updated_at = now() WHERE id IN ('x000', 'x001')"
        )
        assert [await conn.fetchval(page_of, f"x{i:03}") for i in (0, 1)] == first


async def test_a_lone_move_finds_its_turn_by_key_among_tens_of_turns(pg_store):
    # Given 80 turns, their statistics fresh, and one claimed
    for i in range(80):
        await _submit(pg_store, request_id=f"r{i}", session=f"s{i}")
    await pg_store.pool.execute("ANALYZE turns")
    (row,) = (await _claim(pg_store, "b1")).rows
    async with pg_store.pool.acquire() as conn:
        scans = TableScans(conn, "turns")
        before = await scans.now()
        # When its run commits a move on its own (a lone turn's reply), with the pool's generic plans
        (moved,) = await pg_store.turns.commit_moves(conn, [moves.prepare(row, freeze=None)], 30.0)
        assert moved is not None
        # Then the turn was found by its key, not by reading the table whole (with an unnest of
        # parameters, taken for ten rows, the plan read all 80)
        seq, by_index = await scans.since(before)
        assert seq == 0, "the move read the turns whole"
        assert by_index > 0


# ---- a cancel settles what no Hands worker accepted -----------------------------------------


async def _cancel(store: BrainStore, turn_id: str, sent: list[Any]) -> Any:
    from brain.verbs.controls import Kind, control

    return await control(
        store, namespace="ns", turn_id=turn_id, request_id="c1", kind=Kind.CANCEL,
        topology=Topology("t"), wake_channel="ch", send=sent.extend,
    )  # fmt: skip


async def _executions(store: BrainStore, turn_id: str) -> dict[str, Any]:
    rows = await store.pool.fetch(
        "SELECT id, status, command, error FROM executions WHERE turn_id = $1 ORDER BY id", turn_id
    )
    return {r["id"]: r for r in rows}


async def test_a_cancel_of_calls_no_hands_worker_accepted_ends_the_turn_at_once(store):
    # Given a turn whose two calls are INTENDED: their commands wait in a queue nobody serves
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "e1", "e2")

    # When it is cancelled
    sent: list[Any] = []
    receipt = await _cancel(store, turn_id, sent)

    # Then the cancel is applied in its own commit: the turn is CANCELLED without waiting for any
    # pool, each call CANCELLED, never to be sent again, and a cancel for each goes to the route
    # (handed to the relay at once), which leaves a tombstone there for a late command
    assert receipt.status == "applied"
    assert (await _turn(store, turn_id)).status is TurnStatus.CANCELLED
    executions = await _executions(store, turn_id)
    assert [(e["status"], e["command"]) for e in executions.values()] == [("cancelled", None)] * 2
    assert "before any Hands worker accepted it" in str(executions["e1"]["error"])
    assert sorted(decode(c.payload).execution_id for c in sent) == ["e1", "e2"]
    assert [c.queue for c in sent] == [Topology("t").controls("lab")] * 2
    assert await store.pool.fetchval("SELECT count(*) FROM outbox") == 2
    # ... and both calls are closed in the same entry: their outcomes go to the thread's next model
    (*_, (_, last)) = await _facts(store)
    assert last == [
        "control.applied", "execution.cancelled", "execution.cancelled", "turn.results_applied",
        "turn.cancelled",
    ]  # fmt: skip


async def test_a_cancel_waits_only_for_the_calls_a_hands_worker_accepted(store):
    # Given a turn with one call a Hands worker accepted and one it did not
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "e1", "e2")
    await _apply(store, [_events("e1")[0]])

    # When it is cancelled
    sent: list[Any] = []
    receipt = await _cancel(store, turn_id, sent)

    # Then the call nobody accepted is settled now, and the turn waits for the accepted one only
    assert receipt.status == "received"
    turn = await _turn(store, turn_id)
    assert (turn.status, turn.cancel_requested) == (TurnStatus.WAITING, True)
    assert turn.waiting_for == "1 execution(s) to settle after a cancel"
    executions = await _executions(store, turn_id)
    assert [executions[e]["status"] for e in ("e1", "e2")] == ["accepted", "cancelled"]
    assert sorted(decode(c.payload).execution_id for c in sent) == ["e1", "e2"]


async def test_the_parked_gauge_counts_the_brains_parked_messages_by_queue(store):
    from brain.run.metrics import BrainMetrics

    # Given messages the broker parked from the Brain's queues, recorded in its schema
    for queue in ("p.updates", "p.updates", "p.bindings"):
        await store.transact(
            lambda c, queue=queue: store.record_parked(
                c, queue=queue, message_id="m", reason="r", headers={}, body=b"x", kind=None,
                execution_id=None, surfaced="logged",
            )
        )  # fmt: skip

    # When the metrics are scraped
    text = (await BrainMetrics().render(lambda: store.read(store.gauges.count))).decode()

    # Then the gauge says how many, by the queue they were parked from
    assert 'tendon_parked_messages{queue="p.updates"} 2.0' in text
    assert 'tendon_parked_messages{queue="p.bindings"} 1.0' in text
