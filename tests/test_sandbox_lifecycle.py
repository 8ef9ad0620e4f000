"""Sandbox bindings' lifecycle against each backend, in this process, on the real PostgreSQL and,
for Docker, the real engine (skipped with the reason when it is not there; TENDON_TEST_DOCKER=1
fails instead): a creation is never made twice, an unconfirmable one is UNKNOWN until reconciled
with evidence, a resume never re-creates, a deletion removes everything, sessions share a named
binding."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from hands.sandbox.backends.base import ProviderError
from hands.sandbox.backends.docker import DockerBackend
from hands.sandbox.chores import Chores, reconcile_creation, request_deletion
from hands.sandbox.lifecycle import PROVIDER_ATTEMPTS
from hands.sandbox.rules.binding import PRIVATE, identity, labels
from hands.sandbox.rules.errors import SandboxDeletingError, SandboxGoneError, SandboxUnknownError
from hands.sandbox.rules.states import SandboxStatus
from hands.store import open_ledger
from infra.db.sqlite import open_pool
from protocol import ConflictError, SchemaError
from tests.sandbox_support import backend, held, ledger_pool, lifecycle, remove_everything

pytestmark = pytest.mark.timeout(90)
NS = "tests"


# The backends against PostgreSQL, and the SQL of the embedded mode's SQLite once (the dialect
# is what it tests, not the backend).
WHERE = [("local", "postgres"), ("docker", "postgres"), ("local", "sqlite")]


@pytest.fixture(params=WHERE, ids=["-".join(w) for w in WHERE])
def where(request: pytest.FixtureRequest) -> tuple[str, str]:
    return tuple(request.param)  # type: ignore[return-value]


@pytest.fixture
def box(where: tuple[str, str], tmp_path: Path, name: str) -> Iterator[Any]:
    b = backend(where[0], tmp_path)
    yield b
    remove_everything(b, name)


@pytest.fixture
def docker_box(tmp_path: Path, name: str) -> Iterator[Any]:
    b = backend("docker", tmp_path)
    yield b
    remove_everything(b, name)


@pytest.fixture
async def pg_pool(pg_url: str) -> AsyncIterator[Any]:
    async for p in ledger_pool(pg_url):
        yield p


@pytest.fixture
async def pool(where: tuple[str, str], request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """The ledger's pool on PostgreSQL, or on SQLite as the embedded mode keeps it."""
    if where[1] == "sqlite":
        p = await open_pool(tmp_path / "hands.db")
        await open_ledger(p, "hands")
        yield p
        await p.close()
        return
    async for p in ledger_pool(request.getfixturevalue("pg_url")):
        yield p


@pytest.fixture
def name() -> str:
    return f"b-{uuid.uuid4().hex[:8]}"


async def row_of(life: Any, binding: str) -> Any:
    return await life.rows.read(lambda conn: life.rows.get(conn, NS, binding))


async def test_a_creation_whose_reply_was_lost_is_found_by_its_identity_not_made_twice(
    box: Any, pool: Any, name: str
) -> None:
    life = lifecycle(box, pool)
    # Given a creation committed and carried out by the provider, whose reply never came back
    new = life._new(NS, name, "s1", None)
    row = await life.rows.transact(lambda conn: life.rows.begin(conn, new, None, 0.01))
    await box.create(row.identity, life.expected(row))
    # When a call opens the binding
    sb = await life.open(NS, "s1", name, "exec-1")
    # Then it is the sandbox made then: found under the identity, finished, and the only one
    assert sb.identity == row.identity == identity(NS, name, 1)
    assert (await row_of(life, name)).status is SandboxStatus.READY
    assert len([h for h in held(box, name) if not h.startswith("volume:")]) == 1
    await sb.write("a.txt", b"one")
    again = await life.open(NS, "s2", name, "exec-2")
    assert await again.read("a.txt") == b"one"


async def test_something_foreign_under_the_identity_is_unknown_until_reconciled_with_evidence(
    box: Any, pool: Any, name: str
) -> None:
    life = lifecycle(box, pool)
    ident = identity(NS, name, 1)
    # Given something under the binding's identity that does not carry its labels
    await box.create(ident, labels(NS, name, "someone-else", ident))
    with pytest.raises(SandboxUnknownError, match="without this binding's labels"):
        await life.open(NS, "s1", name, "exec-1")
    assert (await row_of(life, name)).status is SandboxStatus.UNKNOWN
    with pytest.raises(SandboxUnknownError, match="reconcile-creation"):
        await life.open(NS, "s1", name, "exec-2")
    # A reconcile the provider contradicts is refused, either way, and one without evidence too
    for outcome in ("created", "absent"):
        with pytest.raises(ConflictError):
            await reconcile_creation(life, NS, name, outcome, evidence="looked", actor="ops")  # type: ignore[arg-type]
    with pytest.raises(SchemaError):
        await reconcile_creation(life, NS, name, "absent", evidence=" ", actor="ops")
    # Nothing was written into the foreign sandbox
    assert await box.find(ident) == labels(NS, name, "someone-else", ident)
    assert await box.read_file(ident, ".tendon/marker.json") is None
    # When it is gone and that is reconciled, deleted, and the binding used again
    await box.delete(ident)
    done = await reconcile_creation(life, NS, name, "absent", evidence="engine shows nothing", actor="ops")
    assert (done.status, done.evidence, done.actor) == (SandboxStatus.FAILED, "engine shows nothing", "ops")
    await request_deletion(life.rows, NS, name)
    await Chores(life, 0.2).once()
    assert (await row_of(life, name)).status is SandboxStatus.DELETED
    sb = await life.open(NS, "s1", name, "exec-3")
    # Then a new generation is made under a new identity
    assert sb.identity == identity(NS, name, 2) != ident
    assert (await row_of(life, name)).generation == 2


async def test_resume_refuses_a_missing_marker_and_never_recreates(box: Any, pool: Any, name: str) -> None:
    life = lifecycle(box, pool)
    sb = await life.open(NS, "s1", name, "exec-1")
    await sb.write("work.txt", b"kept")
    await box.shell(sb.identity, "rm .tendon/marker.json")
    with pytest.raises(SandboxGoneError, match="marker .* is missing.*not re-created"):
        await life.open(NS, "s1", name, "exec-2")
    assert await box.read_file(sb.identity, ".tendon/marker.json") is None
    assert await box.read_file(sb.identity, "work.txt") == b"kept"
    # A marker of another sandbox is refused the same way
    await box.write_file(sb.identity, ".tendon/marker.json", b'{"io.tendon.sandbox.nonce": "other"}')
    with pytest.raises(SandboxGoneError, match="names another sandbox"):
        await life.open(NS, "s1", name, "exec-3")


async def test_a_ready_sandbox_gone_from_the_provider_is_an_error_not_a_new_one(
    box: Any, pool: Any, name: str
) -> None:
    life = lifecycle(box, pool)
    sb = await life.open(NS, "s1", name, "exec-1")
    await box.delete(sb.identity)
    with pytest.raises(SandboxGoneError, match="it is gone"):
        await life.open(NS, "s1", name, "exec-2")
    assert held(box, name) == []


async def test_deletion_removes_the_sandbox_and_its_workspace_and_refuses_new_starts(
    box: Any, pool: Any, name: str
) -> None:
    life = lifecycle(box, pool)
    sb = await life.open(NS, "s1", name, "exec-1")
    await sb.write("x.txt", b"x")
    assert held(box, name)
    deleting = await request_deletion(life.rows, NS, name)
    assert deleting.status is SandboxStatus.DELETING
    with pytest.raises(SandboxDeletingError):
        await life.open(NS, "s2", name, "exec-new")
    # exec-1 is in no ledger row, so it is not open: nothing to wait for
    assert await Chores(life, 0.2).once() == 1
    assert (await row_of(life, name)).status is SandboxStatus.DELETED
    assert held(box, name) == []  # the container and its volume, or the directory
    # A worker that still thought it DELETING moves nothing: the row's status guards it
    stale = await life.rows.transact(lambda conn: life.rows.move(conn, deleting, SandboxStatus.DELETED))
    assert stale is None


async def test_two_sessions_share_a_named_binding_but_not_each_others_own(
    box: Any, pool: Any, name: str
) -> None:
    life = lifecycle(box, pool)
    a = await life.open(NS, "alice", name, "exec-1")
    b = await life.open(NS, "bob", name, "exec-2")
    assert a.identity == b.identity
    await a.write("shared.txt", b"from alice")
    assert await b.read("shared.txt") == b"from alice"
    own = await life.open(NS, "alice", None, "exec-3")
    assert own.row.binding_id == PRIVATE + "alice" and own.identity != a.identity
    with pytest.raises(SchemaError):
        await life.open(NS, "bob", PRIVATE + "alice", "exec-4")
    remove_everything(box, PRIVATE + "alice")
    other_namespace = identity("elsewhere", name, 1)
    assert other_namespace != a.identity


async def test_an_engine_that_cannot_be_asked_is_retried_a_bounded_number_of_times_then_unknown(
    pg_pool: Any, name: str
) -> None:
    import docker

    pool = pg_pool

    nowhere = docker.DockerClient(base_url="unix:///nonexistent", version="1.41")
    away = DockerBackend(image="none", network="none", client=nowhere)
    life = lifecycle(away, pool)
    for _ in range(PROVIDER_ATTEMPTS - 1):
        with pytest.raises(ProviderError):
            await life.open(NS, "s1", name, "exec-1")
    with pytest.raises(SandboxUnknownError, match=f"could not be asked {PROVIDER_ATTEMPTS} times"):
        await life.open(NS, "s1", name, "exec-1")
    assert (await row_of(life, name)).status is SandboxStatus.UNKNOWN


async def _register(pool: Any, *workers: str) -> None:
    async with pool.acquire() as conn:
        for n, worker in enumerate(workers):
            await conn.execute("INSERT INTO workers (id, kind, lock_key) VALUES ($1, 'hands', $2)", worker, n)


async def test_a_dead_workers_chores_are_taken_over_and_a_live_ones_are_not(
    box: Any, pool: Any, name: str
) -> None:
    await _register(pool, "w1", "w2")
    one, two = lifecycle(box, pool, "w1"), lifecycle(box, pool, "w2")
    await one.open(NS, "s1", name, "exec-1")
    row = await request_deletion(one.rows, NS, name)
    # Given the deletion's lease held by a live worker, the other's scan leaves it alone
    assert await one.rows.transact(lambda conn: one.rows.take_lease(conn, row, "w1", 60)) is not None
    assert await Chores(two, 0.2).once() == 0
    assert held(box, name)
    # When that worker is presumed dead, the other takes the chore over and carries it out
    async with pool.acquire() as conn:
        await conn.execute("UPDATE workers SET dead_at = now() WHERE id = 'w1'")
    assert await Chores(two, 0.2).once() == 1
    assert (await row_of(two, name)).status is SandboxStatus.DELETED
    assert held(box, name) == []


async def test_a_deletion_repeated_after_a_crash_finds_nothing_left_and_finishes(
    box: Any, pool: Any, name: str
) -> None:
    life = lifecycle(box, pool)
    sb = await life.open(NS, "s1", name, "exec-1")
    await request_deletion(life.rows, NS, name)
    await box.delete(sb.identity)  # what a worker killed after the provider's delete did
    assert await Chores(life, 0.2).once() == 1
    assert (await row_of(life, name)).status is SandboxStatus.DELETED


async def test_a_failing_deletion_is_retried_a_bounded_number_of_times_then_waits_to_be_asked_again(
    pool: Any, name: str, box: Any
) -> None:
    import docker

    life = lifecycle(box, pool)
    await life.open(NS, "s1", name, "exec-1")
    await request_deletion(life.rows, NS, name)
    nowhere = docker.DockerClient(base_url="unix:///nonexistent", version="1.41")
    life.backend = DockerBackend(image="none", network="none", client=nowhere)
    chores = Chores(life, 0.2)
    for attempt in range(1, PROVIDER_ATTEMPTS + 1):
        async with pool.acquire() as conn:  # its pause, over at once
            await conn.execute("UPDATE sandboxes SET due_at = now() WHERE binding_id = $1", name)
        assert await chores.once() == 1
        row = await row_of(life, name)
        assert (row.status, row.attempts) == (SandboxStatus.DELETING, attempt)
    assert row.due_at is None and f"deletion failed {PROVIDER_ATTEMPTS} times" in str(row.error)
    assert await chores.once() == 0  # nothing more until it is asked again
    again = await request_deletion(life.rows, NS, name)
    assert (again.attempts, again.error, again.due_at is not None) == (0, None, True)


async def test_keep_alive_starts_a_container_the_engine_stopped(
    docker_box: Any, pg_pool: Any, name: str
) -> None:
    box, pool = docker_box, pg_pool
    life = lifecycle(box, pool)
    sb = await life.open(NS, "s1", name, "exec-1")
    container = box._docker().containers.get(sb.identity)
    container.stop(timeout=1)
    async with pool.acquire() as conn:  # its keep-alive, due now
        await conn.execute("UPDATE sandboxes SET due_at = now() WHERE binding_id = $1", name)
    assert await Chores(life, 0.2).once() == 1
    container.reload()
    assert container.status == "running"
    assert (await row_of(life, name)).due_at is not None


async def test_an_image_the_engine_does_not_have_fails_each_call_then_is_unknown_never_half_made(
    docker_box: Any, pg_pool: Any, name: str
) -> None:
    missing = DockerBackend(image="tendon-no-such-image:none", network="none", client=docker_box._docker())
    life = lifecycle(missing, pg_pool)
    for _ in range(PROVIDER_ATTEMPTS - 1):
        with pytest.raises(ProviderError, match="tendon-no-such-image"):
            await life.open(NS, "s1", name, "exec-1")
    with pytest.raises(SandboxUnknownError):
        await life.open(NS, "s1", name, "exec-1")
    assert [h for h in held(docker_box, name) if not h.startswith("volume:")] == []  # no container
    await request_deletion(life.rows, NS, name)
    await Chores(life, 0.2).once()
    assert held(docker_box, name) == []  # its volume went with the deletion


async def test_two_workers_opening_a_new_binding_at_once_make_one_sandbox(
    box: Any, pool: Any, name: str
) -> None:
    await _register(pool, "w1", "w2")
    one, two = lifecycle(box, pool, "w1"), lifecycle(box, pool, "w2")
    a, b = await asyncio.gather(one.open(NS, "s1", name, "exec-1"), two.open(NS, "s2", name, "exec-2"))
    assert a.identity == b.identity
    assert [h for h in held(box, name) if not h.startswith("volume:")] == [a.identity]
    assert (await row_of(one, name)).status is SandboxStatus.READY


async def test_a_binding_made_by_another_transaction_meanwhile_is_taken_not_made_again(
    pg_pool: Any, tmp_path: Path, name: str
) -> None:
    box = backend("local", tmp_path)
    one, two = lifecycle(box, pg_pool, "w1"), lifecycle(box, pg_pool, "w2")
    async with pg_pool.acquire() as conn:
        async with conn.transaction():
            made = await one.rows.begin(conn, one._new(NS, name, "s1", None), None, 5)
            # Another worker's call finds no row yet, and its insert waits on this one's key
            call = asyncio.create_task(two.open(NS, "s2", name, "exec-2"))
            await asyncio.sleep(0.5)
            assert not call.done()
    sb = await call  # the first one's row, created by the second (its creator w1 is not alive)
    assert made is not None and sb.identity == made.identity and sb.row.nonce == made.nonce
    assert [h for h in held(box, name)] == [made.identity]


async def test_keep_alive_forgets_the_uses_whose_executions_settled(box: Any, pool: Any, name: str) -> None:
    life = lifecycle(box, pool)
    for n in range(3):  # executions no ledger row holds open: settled
        await life.open(NS, f"s{n}", name, f"exec-{n}")

    async def uses() -> int:
        async with pool.acquire() as conn:
            return int(await conn.fetchval("SELECT count(*) FROM sandbox_uses WHERE binding_id = $1", name))

    assert await uses() == 3
    async with pool.acquire() as conn:
        await conn.execute("UPDATE sandboxes SET due_at = now() WHERE binding_id = $1", name)
    assert await Chores(life, 0.2).once() == 1
    assert await uses() == 0
    assert (await row_of(life, name)).status is SandboxStatus.READY


async def test_a_command_whose_wrapper_never_starts_is_fenced_off_and_fails_saying_it_never_ran(
    pg_pool: Any, tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hands.sandbox.rules import oplog
    from hands.sandbox.tools import CommandNotStartedError, _Follower, _prepare
    from hands.tools.declare import ToolContext

    monkeypatch.setattr(oplog, "STARTING_GRACE", 0.5)
    sb = await lifecycle(backend("local", tmp_path), pg_pool).open(NS, "s1", name, "exec-1")
    await _prepare(sb, "exec-1", "echo ran >> starts.txt", 30)
    await sb.write(f"{oplog.op_dir('exec-1')}/run.sh", b"exit 0\n")  # a wrapper that never takes its lock
    ctx = ToolContext(operation_id="exec-1", namespace=NS, session_id="s1")
    with pytest.raises(CommandNotStartedError, match="did not run"):
        await _Follower(sb, ctx, {"op": "exec-1"}).run("echo ran >> starts.txt", 30, idempotent=False)
    # The real wrapper, started late, finds the lock taken and leaves: the command never runs
    await _prepare(sb, "exec-1", "echo ran >> starts.txt", 30)
    await sb.shell(f"sh {oplog.op_dir('exec-1')}/run.sh")
    assert await sb.read("starts.txt") is None
