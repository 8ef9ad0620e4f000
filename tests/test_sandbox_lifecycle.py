"""Sandbox bindings' lifecycle against each backend, in this process, on the real PostgreSQL and,
for Docker, the real engine (skipped with the reason when it is not there; TENDON_TEST_DOCKER=1
fails instead): a creation is never made twice, an unconfirmable one is UNKNOWN until reconciled
with evidence, a resume never re-creates, a deletion removes everything, sessions share a named
binding."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
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
from protocol import ConflictError, SchemaError
from tests.sandbox_support import backend, held, ledger_pool, lifecycle, remove_everything

pytestmark = pytest.mark.timeout(90)
NS = "tests"


@pytest.fixture(params=["local", "docker"])
def box(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    return backend(request.param, tmp_path)


@pytest.fixture
async def pool(pg_url: str) -> AsyncIterator[Any]:
    async for p in ledger_pool(pg_url):
        yield p


@pytest.fixture
def name() -> str:
    return f"b-{uuid.uuid4().hex[:8]}"


@pytest.fixture(autouse=True)
def _clean(box: Any, name: str) -> Any:
    yield
    remove_everything(box, name)


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
    pool: Any, name: str, box: Any
) -> None:
    if not isinstance(box, DockerBackend):
        pytest.skip("the Docker backend's client is what is pointed at an engine that is not there")
    import docker

    nowhere = docker.DockerClient(base_url="unix:///nonexistent", version="1.41")
    away = DockerBackend(image="none", network="none", client=nowhere)
    life = lifecycle(away, pool)
    for _ in range(PROVIDER_ATTEMPTS - 1):
        with pytest.raises(ProviderError):
            await life.open(NS, "s1", name, "exec-1")
    with pytest.raises(SandboxUnknownError, match=f"could not be asked {PROVIDER_ATTEMPTS} times"):
        await life.open(NS, "s1", name, "exec-1")
    assert (await row_of(life, name)).status is SandboxStatus.UNKNOWN
