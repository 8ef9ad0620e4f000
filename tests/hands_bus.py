"""Pytest plugin: the lab Hands pool's world and a bus to talk to it (route ``lab``).

``world``: a Tendon world whose lab tools record their runs and charges in files; ``bus``: the
test's side of the broker, publishing commands and controls and collecting every update;
``proxy``: the world's PostgreSQL behind a proxy that can lose the answer to a COMMIT. Load
it with ``pytest_plugins`` (tests/conftest.py does).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import pytest

from hands.tools.declare import Tool
from infra.transport.broker import Broker, Topology
from protocol import (
    CancelBody,
    CancelControl,
    EventBatch,
    ExecuteBody,
    ExecuteCommand,
    ReplayBody,
    ReplayControl,
    command_batch_bytes,
    decode,
    encode,
    new_id,
    request_digest,
)
from tests import hands_test_tools as lab
from tests.hands_pg_proxy import CommitCutter
from tests.support import Observer, Processes, TendonEnv, wait_for

SERVE = ["-m", "hands", "serve", "--route", "lab", "--tools", "tests.hands_test_tools"]
WAIT = 20.0


@pytest.fixture
def world(tendon: TendonEnv, tmp_path: Path) -> TendonEnv:
    tendon.routes = {"lab"}
    tendon.extra.update(
        {
            "LAB_RUNS_FILE": str(tmp_path / "runs.txt"),
            "LAB_CHARGES_FILE": str(tmp_path / "charges.json"),
        }
    )
    return tendon


class Bus:
    """The test's side of the broker: publish commands and controls, collect updates."""

    def __init__(self, world: TendonEnv, broker: Broker) -> None:
        self.world = world
        self.broker = broker
        self.topology = broker.topology
        self.raw: dict[str, list[Any]] = defaultdict(list)
        self.arrivals: list[Any] = []  # every event, in the order the messages arrived
        self.batches: list[list[Any]] = []  # the events of each message, in arrival order

    async def _on_update(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        envelope = decode(message.body)
        events = envelope.events if isinstance(envelope, EventBatch) else [envelope]
        self.batches.append(events)
        for event in events:
            self.raw[event.execution_id].append(event)
            self.arrivals.append(event)
        await message.ack()

    async def publish_command(self, command: ExecuteCommand | bytes) -> None:
        body = command if isinstance(command, bytes) else encode(command)
        await self.broker.publish(self.topology.commands("lab"), body, message_id=new_id())

    async def publish_batch(self, commands: list[ExecuteCommand | bytes]) -> str:
        """Publish commands as one ``CommandBatch`` message, as a Brain's relay does; its id."""
        message_id = new_id()
        bodies = [c if isinstance(c, bytes) else encode(c) for c in commands]
        await self.broker.publish(
            self.topology.commands("lab"), command_batch_bytes(bodies, message_id), message_id=message_id
        )
        return message_id

    async def publish_control(self, control: Any) -> None:
        await self.broker.publish(self.topology.controls("lab"), encode(control), message_id=new_id())

    def events(self, execution_id: str) -> list[Any]:
        """Every event received for ``execution_id``, in arrival order (duplicates included)."""
        return list(self.raw[execution_id])

    def messages_of(self, execution_id: str) -> list[list[int]]:
        """The seqs of ``execution_id`` each message that carried some of them carried."""
        carried = ([e.seq for e in batch if e.execution_id == execution_id] for batch in self.batches)
        return [seqs for seqs in carried if seqs]

    def by_seq(self, execution_id: str) -> dict[int, Any]:
        return {e.seq: e for e in self.events(execution_id)}

    async def wait_seqs(self, execution_id: str, last: int) -> dict[int, Any]:
        """Wait until seqs 1..last of ``execution_id`` all arrived; return them by seq."""

        async def complete() -> dict[int, Any] | None:
            got = self.by_seq(execution_id)
            return got if all(s in got for s in range(1, last + 1)) else None

        return await wait_for(complete, timeout=WAIT, what=f"events 1..{last} of {execution_id}")

    async def wait_kind(self, execution_id: str, kind: str) -> Any:
        async def found() -> Any:
            return next((e for e in self.events(execution_id) if e.kind == kind), None)

        return await wait_for(found, timeout=WAIT, what=f"a {kind} event for {execution_id}")

    async def parked(self, queue: str, count: int = 1) -> list[asyncpg.Record]:
        """The messages of ``queue`` the pool parked and read back (its ``parked`` table)."""
        return await Observer(self.world).parked(queue, count=count, component="hands")


@pytest.fixture
async def bus(world: TendonEnv) -> AsyncIterator[Bus]:
    settings = world.settings()
    async with Broker(settings.amqp_url, Topology(settings.queue_prefix)) as broker:
        bus = Bus(world, broker)
        await broker.consume(broker.topology.updates, bus._on_update, prefetch=100)
        yield bus


@pytest.fixture
async def proxy(world: TendonEnv) -> AsyncIterator[CommitCutter]:
    """A proxy to the world's PostgreSQL that can lose the answer to a COMMIT (``arm(cut=N)``)."""
    async with CommitCutter(world.database_url) as proxy:
        yield proxy


def command(
    t: Tool,
    args: dict[str, Any],
    *,
    binding_digest: str | None = None,
    execution_id: str | None = None,
) -> ExecuteCommand:
    """An execute command for test tool ``t`` as a Brain would publish it."""
    execution_id = execution_id or new_id()
    body = ExecuteBody(
        turn_id=f"turn-{execution_id[:6]}",
        call_id=f"call-{execution_id[:6]}",
        route="lab",
        tool=t.name,
        binding_digest=binding_digest or t.binding.digest,
        replay_policy=t.binding.replay_policy,
        args=args,
    )
    return ExecuteCommand(
        execution_id=execution_id,
        namespace="tests",
        session_id=f"s{execution_id[:8]}",
        request_digest=request_digest(execution_id, body),
        body=body,
    )


async def start_worker(processes: Processes, world: TendonEnv, **env: str) -> Any:
    return await processes.start_ready("hands", SERVE, {**world.env, **env})


async def start_worker_behind(proxy: CommitCutter, processes: Processes, world: TendonEnv) -> Any:
    """A worker whose ledger connection goes through ``proxy``, and whose recovery scan is too
    slow to help (so what a lost COMMIT answer leaves is the command handling's to mend)."""
    env = {"TENDON_HANDS_DATABASE_URL": proxy.dsn, "TENDON_SCAN_INTERVAL": "30"}
    return await start_worker(processes, world, **env)


def cancel_of(cmd: ExecuteCommand, reason: str) -> CancelControl:
    """The cancel a Brain sends for ``cmd``'s execution."""
    return CancelControl(**_scope(cmd), body=CancelBody(reason=reason))


def replay_of(cmd: ExecuteCommand, from_seq: int) -> ReplayControl:
    """The replay request a Brain sends for ``cmd``'s execution."""
    return ReplayControl(**_scope(cmd), body=ReplayBody(from_seq=from_seq))


def _scope(cmd: ExecuteCommand) -> dict[str, str]:
    return {
        "execution_id": cmd.execution_id,
        "namespace": cmd.namespace,
        "session_id": cmd.session_id,
        "request_digest": cmd.request_digest,
    }


def runs(world: TendonEnv) -> list[tuple[str, str, int]]:
    return lab.runs(Path(world.extra["LAB_RUNS_FILE"]))


async def ledger_fetch(world: TendonEnv, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(world.database_url, server_settings={"search_path": f"th_{world.suffix}"})
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()
