"""The embedded mode: a Brain and one Hands pool in one process, on one data directory.

Same code as the distributed mode, other backends behind the same interfaces:

=============  ==========================  ===============================
component      distributed                 embedded (under ``data_dir``)
=============  ==========================  ===============================
Brain store    PostgreSQL (asyncpg)        ``brain.sqlite3``
Hands ledger   PostgreSQL, own schema      ``hands.sqlite3``
transport      RabbitMQ (aio-pika)         ``queue.sqlite3`` (LocalBroker)
object store   S3 (boto3)                  ``objects/`` (DirectoryObjectStore)
liveness       advisory locks              the data directory's file lock
=============  ==========================  ===============================

One process owns a data directory at a time (an exclusive ``flock``); that is what lets
"registered since this process opened the file" mean "alive" for leases and recovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from brain.app import Backends
from brain.app import run as run_brain
from brain.store import BrainStore, open_brain_store, wake_channel
from hands.app import HandsApp
from hands.backends import HandsBackends
from hands.store import Ledger, ledger_for
from hands.tools.mcp_config import McpServerSpec
from infra.db.sqlite import open_pool
from infra.liveness.registrations import LocalWorkerRegistration
from infra.objects.directory import DirectoryObjectStore
from infra.objects.payloads import PayloadCodec
from infra.process.killpoints import KillPoints
from infra.process.settings import Settings
from infra.transport import Topology
from infra.transport.localqueue import LocalBroker
from protocol import ConflictError


@dataclass(frozen=True)
class DataDir:
    """Where an embedded Tendon keeps everything."""

    root: Path

    @property
    def brain_db(self) -> Path:
        return self.root / "brain.sqlite3"

    @property
    def hands_db(self) -> Path:
        return self.root / "hands.sqlite3"

    @property
    def queue(self) -> Path:
        return self.root / "queue.sqlite3"

    @property
    def objects(self) -> Path:
        return self.root / "objects"

    @property
    def lock(self) -> Path:
        return self.root / "lock"


@contextlib.contextmanager
def exclusive(data: DataDir) -> Iterator[None]:
    """Hold the data directory's lock, or fail at once with a clear error."""
    data.root.mkdir(parents=True, exist_ok=True)
    fd = os.open(data.lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise ConflictError(f"another Tendon process is using {data.root}") from exc
        yield  # the kernel drops the lock when the process dies, SIGKILL included
    finally:
        os.close(fd)


@dataclass
class LocalSystem:
    """A running embedded Tendon: its stores, for reading, and how to stop it."""

    brain: BrainStore
    ledger: Ledger
    brain_task: asyncio.Task[int]
    hands: list[HandsApp]
    stop: asyncio.Event
    wake_channel: str
    ready: asyncio.Event  # set once the Brain serves (its HTTP API too, when it has one)
    http: str | None = None  # HOST:PORT of its HTTP API, once ready (None: it serves none)

    @property
    def served(self) -> frozenset[str]:
        """The tools its pools serve: what a submit to it may name."""
        return served_by(self.hands)


def served_by(hands: Sequence[HandsApp]) -> frozenset[str]:
    return frozenset(name for h in hands if h.registry is not None for name in h.registry.names)


class Served(Collection[str]):
    """The tools the pools serve now, read when asked (an MCP server's may change while it runs)."""

    def __init__(self, hands: Sequence[HandsApp]) -> None:
        self.hands = hands

    def __contains__(self, name: object) -> bool:
        return name in served_by(self.hands)

    def __iter__(self) -> Iterator[str]:
        return iter(served_by(self.hands))

    def __len__(self) -> int:
        return len(served_by(self.hands))


def _routes(
    pools: Sequence[tuple[str, str]], mcp: Mapping[str, Sequence[McpServerSpec]]
) -> list[dict[str, Any]]:
    """Each route's pool: its tools module and MCP servers (a route of both gets one pool)."""
    routes: dict[str, str | None] = {route: tools for route, tools in pools}
    for route in mcp:
        routes.setdefault(route, None)
    return [{"route": route, "tools": tools, "mcp": mcp.get(route, ())} for route, tools in routes.items()]


@asynccontextmanager
async def run_local(
    settings: Settings,
    data: DataDir,
    *,
    pools: Sequence[tuple[str, str]],
    killpoints: KillPoints,
    before_start: Callable[[BrainStore], Awaitable[None]] | None = None,
    follows_edits: bool = False,
    mcp: Mapping[str, Sequence[McpServerSpec]] | None = None,
) -> AsyncIterator[LocalSystem]:
    """Start a Brain and a Hands pool per (route, tools module) of ``pools`` on ``data``; stop
    them all on exit. ``mcp``: the MCP servers each route's pool serves (``_routes``).
    ``before_start``: what to read of the store (this process owns the directory now) before
    anything runs; ``follows_edits``: a development server (``brain.app.Backends``)."""
    async with AsyncExitStack() as stack:
        stack.enter_context(exclusive(data))
        brain_pool = await open_pool(data.brain_db)
        stack.push_async_callback(brain_pool.close)
        brain = await open_brain_store(brain_pool)
        if before_start is not None:
            await before_start(brain)
        ledger_pool = await open_pool(data.hands_db)
        stack.push_async_callback(ledger_pool.close)
        ledger = ledger_for(ledger_pool)
        store = await stack.enter_async_context(DirectoryObjectStore(data.objects))
        codec = PayloadCodec(store, settings.offload_threshold)
        transport = await stack.enter_async_context(
            LocalBroker(data.queue, Topology(settings.queue_prefix), delivery_limit=settings.delivery_limit)
        )
        pool_backends = HandsBackends(
            ledger, transport, codec, partial(LocalWorkerRegistration, ledger_pool, "hands")
        )
        hands = [
            await stack.enter_async_context(
                HandsApp(settings, kill=killpoints, backends=pool_backends, **pool)
            )
            for pool in _routes(pools, mcp or {})
        ]
        stop = asyncio.Event()
        register = partial(LocalWorkerRegistration, brain_pool, "brain")
        backends = Backends(
            brain, transport, codec, register, brain_pool.add_listener, follows_edits, Served(hands)
        )

        def ready(http: str | None) -> None:  # called from the Brain's task, once ``system`` exists
            system.http = http
            system.ready.set()

        brain_task = asyncio.create_task(run_brain(backends, settings, killpoints, stop, ready))
        system = LocalSystem(brain, ledger, brain_task, hands, stop, wake_channel(settings), asyncio.Event())
        hands_tasks = [asyncio.create_task(h.serve()) for h in hands]
        try:
            yield system
        finally:
            stop.set()
            for h in hands:
                h.stop()
            await brain_task
            for task in hands_tasks:
                await task
