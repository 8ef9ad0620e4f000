"""One Hands pool process, composed: ``async with HandsApp(...) as app: await app.serve()``.

Start-up, in order: load the tools (fail before touching any service), open the ledger pool
and apply migrations, register this worker (advisory-lock liveness), open the object store
(if configured) and the broker, start the event relay and the recovery scan, announce the
bindings, start consuming controls and commands, write the ready file.

Shutdown (SIGTERM/SIGINT, or leaving the block) drains: stop taking commands, stop claiming
orphans, let running tools finish for up to ``grace`` seconds, publish what is pending, and
close everything in reverse order. Nothing is lost if this is cut short: the rows are the truth.

If the worker loses its liveness while the process lives on (its lock session ended), other
workers may already be claiming its executions: the recovery scan cancels every local body
at once, nothing more is committed, and :meth:`HandsApp.serve` raises StaleOwnerError (the
CLI exits with code 2; whatever runs the process restarts it under a new worker id).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from types import TracebackType

from hands.run.controls import ControlConsumer
from hands.run.executor import Executor
from hands.run.recovery import RecoveryScanner
from hands.run.relay import EventRelay
from hands.run.worker import CommandConsumer
from hands.run.writer import LedgerWriter
from hands.store import Ledger, ledger_for, open_ledger
from hands.tools.registry import ToolRegistry, load_tools
from infra.db import create_pool, keep_statistics
from infra.db.retention import DAY, Horizon, keep_pruned
from infra.liveness import Liveness
from infra.liveness.registrations import WorkerRegistration
from infra.objects.payloads import PayloadCodec, open_payload_codec
from infra.process.killpoints import KillPoints
from infra.process.logging import bind_worker, get_logger
from infra.process.ready import ReadyFile, clear
from infra.process.settings import Settings
from infra.process.startup import wait_for
from infra.process.tracing import open_tracing
from infra.transport import Consumer, Transport
from infra.transport.broker import Broker, Topology
from infra.transport.parked import ParkedConsumer
from protocol import BindingsAnnouncement, BindingsBody, StaleOwnerError

log = get_logger(__name__)


@dataclass(frozen=True)
class HandsBackends:
    """What a pool runs on. Opened by someone else (the embedded mode), the app uses but never
    closes them; ``HandsApp`` opens the distributed ones itself."""

    ledger: Ledger
    transport: Transport
    codec: PayloadCodec
    register: Callable[..., Liveness]  # the worker registration, given its options


class HandsApp:
    """The Hands pool of one route in this process."""

    recovery: RecoveryScanner  # made at start; the liveness keeper wakes it after a death

    def __init__(
        self,
        settings: Settings,
        *,
        route: str,
        tools: str,
        kill: KillPoints | None = None,
        concurrency: int | None = None,
        grace: float | None = None,
        backends: HandsBackends | None = None,
    ) -> None:
        self.settings = settings
        self.backends = backends
        self.route = route
        self.tools_spec = tools
        self.kill = kill or KillPoints()
        self.concurrency = concurrency or settings.concurrency
        self.grace = settings.drain_seconds if grace is None else grace
        self.topology = Topology(settings.queue_prefix)
        self.registry: ToolRegistry | None = None
        self.worker_id = ""
        self._stack = AsyncExitStack()
        self._stop = asyncio.Event()
        self._background: list[asyncio.Task[None]] = []
        self._channels: list[Consumer] = []

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
        done, _ = await asyncio.wait([stop, *self._background], return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        for task in done:
            if task is not stop and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    # ---- start --------------------------------------------------------------------------

    async def _start(self) -> None:
        s = self.settings
        self.registry = load_tools(self.tools_spec, self.route)
        schema = s.hands_schema

        backends = self.backends or await self._open_backends()
        ledger, broker, codec = backends.ledger, backends.transport, backends.codec
        _, applied = await open_ledger(ledger.pool, schema)
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

        self.relay = EventRelay(
            ledger, broker, route=self.route, interval=s.scan_interval, kill=self.kill,
            max_bytes=max(256 * 1024, s.offload_threshold), linger=s.event_linger,
        )  # fmt: skip
        self.writer = LedgerWriter(ledger, codec, self.relay.send)
        self.executor = Executor(
            ledger=ledger,
            writer=self.writer,
            registry=self.registry,
            worker_id=self.worker_id,
            kill=self.kill,
            concurrency=self.concurrency,
            tracing=self._stack.enter_context(open_tracing(s.otlp_endpoint, "tendon-hands")),
            confirm_owner=self.liveness.confirm,
        )
        self.recovery = RecoveryScanner(
            route=self.route,
            executor=self.executor,
            interval=s.scan_interval,
        )
        self.commands = CommandConsumer(
            route=self.route,
            queue=self.topology.commands(self.route),
            broker=broker,
            codec=codec,
            registry=self.registry,
            executor=self.executor,
            relay=self.relay,
            kill=self.kill,
            ledger_horizon=self.settings.retain_ledger_days * DAY,
        )
        self.controls = ControlConsumer(
            route=self.route,
            queue=self.topology.controls(self.route),
            broker=broker,
            codec=codec,
            relay=self.relay,
            executor=self.executor,
        )
        self._background = [
            asyncio.create_task(self.relay.run(), name="event-relay"),
            asyncio.create_task(self.recovery.run(), name="recovery-scan"),
            asyncio.create_task(keep_statistics(ledger.pool), name="statistics"),
            asyncio.create_task(keep_pruned(ledger.transact, self._horizons(ledger)), name="retention"),
            asyncio.create_task(self._watch_liveness(), name="liveness"),
        ]
        self._stack.push_async_callback(self._cancel_background)

        announcement = BindingsAnnouncement(
            body=BindingsBody(route=self.route, worker=self.worker_id, bindings=self.registry.bindings)
        )
        await broker.publish(
            self.topology.bindings,
            await codec.pack(announcement),
            message_id=announcement.message_id,
        )
        # What the broker parks is read back, recorded and surfaced (infra.transport.parked).
        await ParkedConsumer(
            ledger, broker, self.topology.commands(self.route), self.commands.surface_parked
        ).start()
        await ParkedConsumer(ledger, broker, self.topology.controls(self.route)).start()
        self._channels.append(
            await broker.consume(
                self.topology.controls(self.route), self.controls.handle, prefetch=self.concurrency
            )
        )
        self._channels.append(
            await broker.consume(
                self.topology.commands(self.route), self.commands.handle, prefetch=self.concurrency
            )
        )
        if s.ready_file:  # says ready while its database and broker are up
            services = {"PostgreSQL": lambda: self.liveness.up, "RabbitMQ": lambda: broker.connected}
            await self._stack.enter_async_context(ReadyFile(s.ready_file, self.worker_id, services))
        log.info(
            "hands_ready",
            worker=self.worker_id,
            route=self.route,
            tools=self.registry.names,
            concurrency=self.concurrency,
            migrations_applied=applied,
            object_store=codec.store is not None,
            schema=schema,
        )

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
        self.executor.abandon(reason)
        raise StaleOwnerError(reason)

    async def _open_backends(self) -> HandsBackends:
        """The distributed backends, each waited for (``TENDON_SERVICE_WAIT_SECONDS``), closed with
        the app."""
        s = self.settings
        clear(s.ready_file)  # a dead predecessor's (the same container), before any wait
        patience = s.service_wait_seconds
        pool = await wait_for(
            partial(create_pool, s.ledger_database_url, s.hands_schema, max_size=s.db_pool_size),
            service="PostgreSQL",
            url=s.ledger_database_url,
            patience=patience,
        )
        self._stack.push_async_callback(pool.close)
        ledger = ledger_for(pool)
        codec = await self._stack.enter_async_context(open_payload_codec(s, patience=patience))
        broker = await self._stack.enter_async_context(
            Broker(s.amqp_url, self.topology, delivery_limit=s.delivery_limit, patience=patience)
        )
        register = partial(WorkerRegistration, s.ledger_database_url, s.hands_schema, "hands")
        return HandsBackends(ledger, broker, codec, register)

    # ---- stop ---------------------------------------------------------------------------

    async def _drain(self) -> None:
        if not self._channels:  # never got to consuming
            return
        log.info("hands_draining", worker=self.worker_id, in_flight=self.executor.in_flight)
        self.commands.stop()
        await self.commands.wait_idle(5.0)
        await self.relay.ack_held()  # accepted: not handed back with the channel
        commands_channel = self._channels[-1]
        # Closing the channel hands unacked (not yet accepted) deliveries back to the queue.
        with contextlib.suppress(Exception):
            await commands_channel.close()
        await self._cancel(self._background[1:])  # no new claims while draining
        await self.executor.drain(self.grace)
        with contextlib.suppress(Exception):
            await self._channels[0].close()
        await self._cancel(self._background[:1])
        try:  # what the last commits produced, so the Brain hears it without waiting for a scan
            await self.relay.flush()
        except Exception:
            log.exception("final_publish_failed")
        log.info("batch_sizes", stats=json.dumps(self.writer.committer.stats(), sort_keys=True),
                 messages=self.relay.messages, events=self.relay.events)  # fmt: skip

    async def _cancel_background(self) -> None:
        await self._cancel(self._background)

    @staticmethod
    async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
