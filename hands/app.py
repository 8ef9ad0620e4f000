"""One Hands pool process, composed: ``async with HandsApp(...) as app: await app.serve()``.

Start-up, in order: load the tools (the ``--tools`` module's, and those the MCP servers list:
fail before touching any service), open the ledger pool
and apply migrations, register this worker (advisory-lock liveness), open the object store
(if configured) and the broker, start the event relay and the recovery scan, announce the
bindings, start consuming controls and commands, write the ready file.

Shutdown (SIGTERM/SIGINT, or leaving the block) drains: stop taking commands, stop claiming
orphans, let running tools finish for up to ``grace`` seconds, publish what is pending, and
close everything in reverse order. Nothing is lost if this is cut short: the rows are the truth.

If the worker loses its liveness while the process lives on (its lock session ended), other
workers may already be claiming its executions: the liveness watch cancels every local body
at once, nothing more is committed, and :meth:`HandsApp.serve` raises StaleOwnerError (the
CLI exits with code 2; whatever runs the process restarts it under a new worker id).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from types import TracebackType

from hands.backends import HandsBackends, open_backends
from hands.run.controls import ControlConsumer
from hands.run.controls_first import ControlsFirst
from hands.run.executor import Executor
from hands.run.outcomes import Outcomes
from hands.run.recovery import RecoveryScanner
from hands.run.relay import EventRelay
from hands.run.tasks import Tasks
from hands.run.worker import CommandConsumer
from hands.run.writer import LedgerWriter
from hands.sandbox.serve import SandboxServing
from hands.store import Ledger, open_ledger
from hands.tools.mcp import McpTool, ParkTimes
from hands.tools.mcp_config import McpServerSpec
from hands.tools.mcp_pool import McpTools
from hands.tools.registry import ToolLoadError, ToolRegistry, load_tools
from infra.db import keep_statistics
from infra.db.retention import DAY, Horizon, keep_pruned
from infra.liveness import new_worker_id
from infra.objects.payloads import PayloadCodec
from infra.process.killpoints import KillPoints
from infra.process.logging import bind_worker, get_logger
from infra.process.ready import ReadyFile, clear
from infra.process.settings import Settings
from infra.process.tracing import open_tracing
from infra.transport import Consumer, Transport
from infra.transport.broker import Topology
from infra.transport.parked import ParkedConsumer
from protocol import BindingsAnnouncement, BindingsBody, StaleOwnerError

log = get_logger(__name__)


@dataclass(frozen=True)
class Background:
    """The pool's background tasks, by what each does."""

    relay: asyncio.Task[None]  # publishes the events commits hand it: the last to stop
    recovery: asyncio.Task[None]  # takes over what dead workers left open
    statistics: asyncio.Task[None]
    retention: asyncio.Task[None]
    liveness: asyncio.Task[None]  # ends serve() once the others presumed this worker dead
    sandbox: asyncio.Task[None] | None = None  # the sandboxes' chores (deletions, keep-alive)

    def all(self) -> list[asyncio.Task[None]]:
        tasks = [self.relay, self.recovery, self.statistics, self.retention, self.liveness]
        return tasks + ([self.sandbox] if self.sandbox is not None else [])


@dataclass(frozen=True)
class Consuming:
    """The pool's consumers of its route's queues."""

    controls: Consumer
    commands: Consumer


class HandsApp:
    """The Hands pool of one route in this process."""

    recovery: RecoveryScanner  # made at start; the liveness keeper wakes it after a death

    def __init__(
        self,
        settings: Settings,
        *,
        route: str,
        tools: str | None = None,
        mcp: Sequence[McpServerSpec] = (),
        kill: KillPoints | None = None,
        concurrency: int | None = None,
        grace: float | None = None,
        backends: HandsBackends | None = None,
        sandbox: str | None = None,
    ) -> None:
        self.settings = settings
        self.backends = backends
        self.route = route
        self.tools_spec = tools
        self.mcp = list(mcp)
        self.kill = kill or KillPoints()
        # Sandbox tools only where asked for (``hands serve`` asks with --sandbox or TENDON_SANDBOX).
        self.sandbox = SandboxServing(settings, route, sandbox, self.kill) if sandbox else None
        self.concurrency = concurrency or settings.concurrency
        self.grace = settings.drain_seconds if grace is None else grace
        self.topology = Topology(settings.queue_prefix)
        self.registry: ToolRegistry | None = None
        self.worker_id = ""
        self._stack = AsyncExitStack()
        self._stop = asyncio.Event()
        self._background: Background | None = None  # once started
        self._consuming: Consuming | None = None  # once it consumes both queues
        self._announce: Callable[[], Awaitable[None]] | None = None  # once it can publish

    # ---- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> HandsApp:
        try:
            await self._start()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self._drain()
        finally:
            await self._stack.aclose()
            log.info("hands_stopped", worker=self.worker_id)

    def stop(self) -> None:
        """Ask :meth:`serve` to return (signal handlers call this)."""
        self._stop.set()

    async def serve(self) -> None:
        """Run until :meth:`stop`; a background loop that dies takes the process down."""
        stop = asyncio.create_task(self._stop.wait())
        background = self._background.all() if self._background is not None else []
        done, _ = await asyncio.wait([stop, *background], return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        for task in done:
            if task is not stop and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    # ---- start --------------------------------------------------------------------------

    async def _start(self) -> None:
        s = self.settings
        registry = await self._load_tools()
        backends = self.backends
        if backends is None:  # the distributed ones, closed with the app
            clear(s.ready_file)  # a dead predecessor's (the same container), before any wait
            backends = await self._stack.enter_async_context(
                open_backends(s, self.topology, new_worker_id("hands"))
            )
        ledger, broker, codec = backends.ledger, backends.transport, backends.codec
        _, applied = await open_ledger(ledger.pool, s.hands_schema)
        self.ledger = ledger
        self.liveness = backends.register(
            lease_seconds=s.lease_seconds,
            grace=s.reconnect_grace,
            interval=s.scan_interval,
            release=ledger.release_owners,
            on_death=lambda dead: self.recovery.wake(),  # their executions are orphans now
            presence=broker,
        )
        await self._stack.enter_async_context(self.liveness)
        self.worker_id = self.liveness.worker_id
        bind_worker("hands", self.worker_id)

        self._compose(ledger, broker, codec)
        self._background = Background(
            relay=asyncio.create_task(self.relay.run(), name="event-relay"),
            recovery=asyncio.create_task(self.recovery.run(), name="recovery-scan"),
            statistics=asyncio.create_task(keep_statistics(ledger.pool), name="statistics"),
            retention=asyncio.create_task(
                keep_pruned(ledger.transact, self._horizons(ledger)), name="retention"
            ),
            liveness=asyncio.create_task(self._watch_liveness(), name="liveness"),
            sandbox=self._sandbox_chores(ledger, codec),
        )
        self._stack.push_async_callback(self._cancel, self._background.all())

        self._announce = partial(self._announce_bindings, broker, codec)
        await self._announce()
        await self._consume(ledger, broker)
        if s.ready_file:  # says ready while its database and broker are up
            services = {"PostgreSQL": lambda: self.liveness.up, "RabbitMQ": lambda: broker.connected}
            await self._stack.enter_async_context(ReadyFile(s.ready_file, self.worker_id, services))
        log.info(
            "hands_ready",
            worker=self.worker_id,
            route=self.route,
            tools=registry.names,
            concurrency=self.concurrency,
            migrations_applied=applied,
            object_store=codec.store is not None,
            schema=s.hands_schema,
        )

    async def _announce_bindings(self, broker: Transport, codec: PayloadCodec) -> None:
        assert self.registry is not None
        announcement = BindingsAnnouncement(
            body=BindingsBody(route=self.route, worker=self.worker_id, bindings=self.registry.bindings)
        )
        await broker.publish(
            self.topology.bindings, await codec.pack(announcement), message_id=announcement.message_id
        )

    async def _tools_changed(self, added: list[McpTool], removed: list[McpTool]) -> None:
        """An MCP server's tools changed while the pool runs: serve the new bindings, stop serving
        the ones they replace, and announce what it serves now (before the pool started: its
        first announcement says it)."""
        assert self.registry is not None
        self.registry.change(added, removed)
        if self._announce is not None:
            await self._announce()

    async def _load_tools(self) -> ToolRegistry:
        """The ``--tools`` module's tools and the MCP servers' (their connections open until the
        pool stops), before any service is touched: a pool with nothing to serve fails here."""
        tools = load_tools(self.tools_spec, self.route).tools if self.tools_spec else []
        if self.mcp:
            park = ParkTimes(after=self.settings.mcp_park_after, check=self.settings.mcp_check_seconds)
            source = McpTools(self.route, self.mcp, on_change=self._tools_changed, park=park)
            tools += (await self._stack.enter_async_context(source)).tools
        if self.sandbox is not None:
            tools += self.sandbox.tools
        if not tools:
            raise ToolLoadError(f"route {self.route} has nothing to serve: give --tools, --mcp or --sandbox")
        self.registry = ToolRegistry(self.route, tools)
        return self.registry

    def _compose(self, ledger: Ledger, broker: Transport, codec: PayloadCodec) -> None:
        """The parts of the pool, each given what it uses by name: the ledger, the writer that
        commits to it, this worker's tasks (slots, reservations), the executor that runs bodies."""
        s = self.settings
        assert self.registry is not None
        self.relay = EventRelay(
            ledger, broker, route=self.route, interval=s.scan_interval, kill=self.kill,
            max_bytes=max(256 * 1024, s.offload_threshold), linger=s.event_linger,
        )  # fmt: skip
        self.writer = LedgerWriter(ledger, codec, self.relay.send)
        self.tasks = Tasks(self.worker_id, self.concurrency)
        self.executor = Executor(
            tasks=self.tasks,
            outcomes=Outcomes(self.tasks, ledger=ledger, writer=self.writer),
            writer=self.writer,
            registry=self.registry,
            kill=self.kill,
            tracing=self._stack.enter_context(open_tracing(s.otlp_endpoint, "tendon-hands")),
            confirm_owner=self.liveness.confirm,
        )
        self.recovery = RecoveryScanner(
            route=self.route, ledger=ledger, tasks=self.tasks, executor=self.executor,
            interval=s.scan_interval,
        )  # fmt: skip
        self.first = ControlsFirst(broker, self.topology.controls(self.route))
        self.commands = CommandConsumer(
            route=self.route,
            queue=self.topology.commands(self.route),
            broker=broker,
            codec=codec,
            registry=self.registry,
            ledger=ledger,
            writer=self.writer,
            tasks=self.tasks,
            executor=self.executor,
            relay=self.relay,
            kill=self.kill,
            first=self.first,
            ledger_horizon=s.retain_ledger_days * DAY,
        )
        self.controls = ControlConsumer(
            route=self.route,
            queue=self.topology.controls(self.route),
            broker=broker,
            codec=codec,
            relay=self.relay,
            ledger=ledger,
            writer=self.writer,
            tasks=self.tasks,
            first=self.first,
            wake=self.recovery.wake,
        )

    async def _consume(self, ledger: Ledger, broker: Transport) -> None:
        """Consume the route's dead-letter queues, then its controls, then its commands."""
        commands, controls = self.topology.commands(self.route), self.topology.controls(self.route)
        # What the broker parks is read back, recorded and surfaced (infra.transport.parked).
        await ParkedConsumer(ledger, broker, commands, self.commands.surface_parked).start()
        await ParkedConsumer(ledger, broker, controls).start()
        self._consuming = Consuming(
            controls=await broker.consume(controls, self.controls.handle, prefetch=self.concurrency),
            commands=await broker.consume(commands, self.commands.handle, prefetch=self.concurrency),
        )

    def _sandbox_chores(self, ledger: Ledger, codec: PayloadCodec) -> asyncio.Task[None] | None:
        if self.sandbox is None:
            return None
        self.sandbox.attach(ledger.pool, self.worker_id, codec.store)
        return asyncio.create_task(self.sandbox.run(), name="sandbox-chores")

    def _horizons(self, ledger: Ledger) -> list[Horizon]:
        s = self.settings
        return [
            Horizon("executions", s.retain_ledger_days * DAY, ledger.prune_finished),
            Horizon("parked", s.retain_parked_days * DAY, ledger.prune_parked),
        ]

    async def _watch_liveness(self) -> None:
        """End (and so end :meth:`serve`) once the others presumed this worker dead."""
        await self.liveness.lost.wait()
        reason = (
            f"worker {self.worker_id} was presumed dead by the others (its lease ran out, or its "
            "lost database connection was not taken again within the grace), so they may be "
            "taking over its executions; stopping its work"
        )
        self.tasks.abandon(reason)
        raise StaleOwnerError(reason)

    # ---- stop ---------------------------------------------------------------------------

    async def _drain(self) -> None:
        consuming, background = self._consuming, self._background
        if consuming is None or background is None:  # never got to consuming
            return
        log.info("hands_draining", worker=self.worker_id, in_flight=self.tasks.in_flight)
        self.commands.stop()
        await self.commands.wait_idle(5.0)
        await self.relay.ack_held()  # accepted: not handed back with the channel
        # Closing the channel hands unacked (not yet accepted) deliveries back to the queue.
        with contextlib.suppress(Exception):
            await consuming.commands.close()
        # No new claims while draining (nor pruning, statistics or a watch on the liveness).
        await self._cancel(
            [background.recovery, background.statistics, background.retention, background.liveness]
            + ([background.sandbox] if background.sandbox is not None else [])
        )
        await self.tasks.drain(self.grace)
        # Controls are consumed until the running tools are done: a cancel still reaches them.
        with contextlib.suppress(Exception):
            await consuming.controls.close()
        await self.first.close()
        await self._cancel([background.relay])
        try:  # what the last commits produced, so the Brain hears it without waiting for a scan
            await self.relay.flush()
        except Exception:
            log.exception("final_publish_failed")
        log.info("batch_sizes", stats=json.dumps(self.writer.committer.stats(), sort_keys=True),
                 messages=self.relay.messages, events=self.relay.events)  # fmt: skip

    @staticmethod
    async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
