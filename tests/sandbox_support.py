"""Sandbox tests' support: the backends under test (local always; Docker when an engine answers,
``TENDON_TEST_DOCKER=1`` making its absence a failure), a ledger schema of the test's own, and
looking at what a backend holds."""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from hands.sandbox.backends.docker import DockerBackend
from hands.sandbox.backends.local import LocalBackend
from hands.sandbox.lifecycle import Lifecycle
from hands.sandbox.rules.binding import PRIVATE, Definition, identity
from hands.store import open_ledger
from infra.db import create_pool
from infra.transport.broker import Broker, Topology
from protocol import encode, new_id
from tests.hands_bus import Bus, replay_of
from tests.support import TendonEnv, run_cli, wait_for

IMAGE = os.environ.get("TENDON_TEST_SANDBOX_IMAGE", "python:3.11-slim")
LABEL = "io.tendon.sandbox.binding"


def docker_client() -> Any:
    """The engine's client, or a skip (a failure under ``TENDON_TEST_DOCKER=1``) saying why not."""
    why = None
    try:
        import docker

        client = docker.from_env(timeout=20)
        client.ping()
        client.images.get(IMAGE)
    except Exception as exc:  # noqa: BLE001 - said in the skip
        why = f"no Docker engine with image {IMAGE} ({type(exc).__name__}: {exc}); set DOCKER_HOST"
    if why is not None:
        if os.environ.get("TENDON_TEST_DOCKER") == "1":
            pytest.fail(f"TENDON_TEST_DOCKER=1 but {why}")
        pytest.skip(why)
    return client


def backend(kind: str, tmp_path: Path) -> Any:
    if kind == "local":
        return LocalBackend(tmp_path / "sandboxes")
    return DockerBackend(image=IMAGE, network="none", client=docker_client())


def spec(kind: str, tmp_path: Path) -> str:
    """What ``--sandbox`` says for ``kind``."""
    if kind == "local":
        return f"local:{tmp_path / 'sandboxes'}"
    docker_client()
    return "docker"


def held(b: Any, binding: str) -> list[str]:
    """The names of everything the backend holds for ``binding`` (containers and volumes, or
    directories whose labels name it)."""
    if isinstance(b, LocalBackend):
        if not b.root.exists():
            return []
        return sorted(p.name for p in b.root.iterdir() if f'"{binding}"' in _labels(p))
    client = b._docker()
    filters = {"label": f"{LABEL}={binding}"}
    containers = [c.name for c in client.containers.list(all=True, filters=filters)]
    volumes = [f"volume:{v.name}" for v in client.volumes.list(filters=filters)]
    return sorted(containers + volumes)


def _labels(p: Path) -> str:
    try:
        return (p / ".tendon/labels.json").read_text()
    except OSError:
        return ""


def remove_everything(b: Any, binding: str) -> None:
    """Leave nothing of a test's sandboxes behind on the engine."""
    if isinstance(b, DockerBackend):
        client = b._docker()
        for c in client.containers.list(all=True, filters={"label": f"{LABEL}={binding}"}):
            c.remove(force=True)
        for v in client.volumes.list(filters={"label": f"{LABEL}={binding}"}):
            v.remove(force=True)


async def ledger_pool(pg_url: str) -> AsyncIterator[Any]:
    schema = f"th_sbx_{uuid.uuid4().hex[:10]}"
    pool = await create_pool(pg_url, schema, max_size=4)
    try:
        await open_ledger(pool, schema)
        yield pool
    finally:
        await pool.close()
        conn = await asyncpg.connect(pg_url)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


def lifecycle(b: Any, pool: Any, worker: str = "test-worker") -> Lifecycle:
    definition = Definition("default", b.config())
    life = Lifecycle(b, definition, lease_seconds=5, keepalive_seconds=60, interval=0.2)
    life.attach(pool, worker)
    return life


# ---- a sandbox pool as real processes, and the test's side of its broker -----------------

ROUTE = "sandbox"


def serve_args(sandbox_spec: str) -> list[str]:
    return ["-m", "hands", "serve", "--route", ROUTE, "--sandbox", sandbox_spec]


def tools_by_name() -> dict[str, Any]:
    from hands.sandbox.tools import sandbox_tools

    life = Lifecycle(LocalBackend("/nonexistent"), Definition("default", {}))
    return {t.name: t for t in sandbox_tools(ROUTE, life, lambda: None)}


def call(tool: str, session: str, **args: Any) -> Any:
    """The execute command a Brain would publish for a sandbox tool."""
    from protocol import ExecuteBody, ExecuteCommand, new_id, request_digest

    t = tools_by_name()[tool]
    execution_id = new_id()
    body = ExecuteBody(
        turn_id=f"turn-{execution_id[:6]}", call_id=f"call-{execution_id[:6]}", route=ROUTE, tool=tool,
        binding_digest=t.binding.digest, replay_policy=t.binding.replay_policy, args=args,
    )  # fmt: skip
    return ExecuteCommand(
        execution_id=execution_id, namespace="tests", session_id=session,
        request_digest=request_digest(execution_id, body), body=body,
    )  # fmt: skip


def output_of(events: list[Any]) -> str:
    """The output pages of an execution, each once, in offset order."""
    pages = {e.body.offset: e.body.data for e in events if e.kind == "output_page"}
    return "".join(pages[o] for o in sorted(pages))


class SandboxBus(Bus):
    """The test's side of the broker for the sandbox route."""

    async def send(self, command: Any) -> str:
        await self.broker.publish(self.topology.commands(ROUTE), encode(command), message_id=new_id())
        return str(command.execution_id)

    async def complete(self, command: Any) -> dict[int, Any]:
        """Every event of ``command``'s execution once its terminal one came, a gap filled as a
        Brain fills it: a replay request from the first missing seq (a worker killed after it
        committed an event but before it published it leaves that seq to the ledger)."""
        last = max((await self.wait_kind(str(command.execution_id), "succeeded")).seq, 1)
        got = self.by_seq(str(command.execution_id))
        missing = [s for s in range(1, last) if s not in got]
        if missing:
            await self.broker.publish(
                self.topology.controls(ROUTE), encode(replay_of(command, missing[0])), message_id=new_id()
            )
        return await self.wait_seqs(str(command.execution_id), last)

    async def cancel(self, command: Any) -> None:
        from protocol import CancelBody, CancelControl

        control = CancelControl(
            execution_id=command.execution_id, namespace=command.namespace, session_id=command.session_id,
            request_digest=command.request_digest, body=CancelBody(reason="test"),
        )  # fmt: skip
        await self.broker.publish(self.topology.controls(ROUTE), encode(control), message_id=new_id())


@asynccontextmanager
async def sandbox_bus(tendon: TendonEnv) -> AsyncIterator[SandboxBus]:
    """The test's side of the world's broker (each test file's ``bus`` fixture)."""
    tendon.routes = {ROUTE}
    settings = tendon.settings()
    async with Broker(settings.amqp_url, Topology(settings.queue_prefix)) as broker:
        b = SandboxBus(tendon, broker)
        await broker.consume(broker.topology.updates, b._on_update, prefetch=100)
        yield b


def workspace(tmp_path: Path, session: str) -> Path:
    """The local workspace of a session's own sandbox (first generation)."""
    return tmp_path / "sandboxes" / identity("tests", PRIVATE + session, 1)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


async def lines_in(path: Path, count: int) -> None:
    async def there() -> bool:
        return _lines(path) >= count

    await wait_for(there, timeout=20, what=f"{count} line(s) in {path}")


async def listed(tendon: TendonEnv, spec: str) -> list[dict[str, Any]]:
    """What ``hands sandbox list --json`` says."""
    args = ["-m", "hands", "sandbox", "list", "--json", "--sandbox", spec]
    code, out, err = await run_cli(args, tendon.env)
    assert code == 0, err
    return list(json.loads(out))


def end_commands(root: Path) -> None:
    """End what a test's local sandboxes still run: the wrappers and their commands outlive the
    workers on purpose, not the test. By the process groups their operation logs name."""
    for name in ("child", "pid"):
        for found in root.glob(f"*/.tendon/ops/*/{name}"):
            try:
                os.killpg(int(found.read_text()), signal.SIGKILL)
            except (ValueError, ProcessLookupError, PermissionError):
                pass


@pytest.fixture
def leftovers(tmp_path: Path) -> Iterator[None]:
    yield
    end_commands(tmp_path / "sandboxes")
