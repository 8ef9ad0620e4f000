"""The Brain process: composition of its parts, started and stopped in order."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from brain.frameworks import run_foreign
from brain.rules.controls import Kind
from brain.run.claims import Served
from brain.run.context import BrainContext
from brain.run.delegation import DelegationLoop
from brain.run.metrics import BrainMetrics
from brain.run.relay import CommandRelay, ControlRelay
from brain.run.runs import Scheduler, Wakeups
from brain.run.scanner import RepairScanner
from brain.run.schedules import ScheduleLoop
from brain.run.updates import BindingsConsumer, UpdateConsumer
from brain.run.webhooks import WebhookLoop
from brain.store import BrainStore, open_store, wake_channel
from brain.verbs.controls import control
from infra.db import Connection, keep_statistics, session_name
from infra.db.notify import Listener
from infra.db.retention import DAY, Horizon, keep_pruned
from infra.liveness import Liveness, new_worker_id
from infra.liveness.registrations import WorkerRegistration
from infra.objects.payloads import PayloadCodec, open_payload_codec
from infra.process.heap import settle_heap
from infra.process.killpoints import KillPoints
from infra.process.logging import bind_worker, get_logger
from infra.process.ready import ReadyFile, clear
from infra.process.settings import Settings, http_address
from infra.process.tracing import Tracing, open_tracing
from infra.transport import Topology, Transport
from infra.transport.broker import Broker
from infra.transport.parked import ParkedConsumer

log = get_logger(__name__)


@dataclass
class Backends:
    """What a Brain runs on: PostgreSQL/RabbitMQ/S3, or the embedded SQLite/local queue/dir."""

    store: BrainStore
    transport: Transport
    codec: PayloadCodec
    register: Callable[..., Liveness]  # the worker registration, given its options
    listen: Callable[[str, Callable[..., Any]], Awaitable[None]]  # wake-up hints
    # A local development server: its API's submits follow edited agents (``Api.edits``); a
    # deployment keeps strict versions.
    follows_edits: bool = False
    # The tools served in this process (an embedded server runs its pools itself): what its
    # submits may name, known before any announcement arrives (a live view: an MCP server's tools
    # may change while it runs). None: those pools announced.
    served_tools: Collection[str] | None = None


@asynccontextmanager
async def open_backends(settings: Settings, worker_id: str) -> AsyncIterator[Backends]:
    """The distributed backends of Brain ``worker_id``, opened in order (each waited for,
    ``TENDON_SERVICE_WAIT_SECONDS``) and closed in reverse. Every database session is named after
    the worker, so that the others end them all when they presume it dead."""
    patience = settings.service_wait_seconds
    name = session_name(worker_id)
    async with AsyncExitStack() as stack:
        store = await open_store(settings, patience=patience, name=name)
        stack.push_async_callback(store.close)
        codec = await stack.enter_async_context(open_payload_codec(settings, patience=patience))
        broker = await stack.enter_async_context(
            Broker(
                settings.amqp_url,
                Topology(settings.queue_prefix),
                delivery_limit=settings.delivery_limit,
                patience=patience,
            )
        )
        listener = await stack.enter_async_context(Listener(settings.database_url, name=name))
        register = partial(
            WorkerRegistration, settings.database_url, settings.brain_schema, "brain", worker_id=worker_id
        )
        yield Backends(store, broker, codec, register, listener.add)


async def serve(settings: Settings, killpoints: KillPoints, stop: asyncio.Event) -> int:
    """Run a distributed Brain until ``stop`` is set (see :func:`run`).

    A Brain that the others presumed dead (paused or cut off for longer than its lease) starts
    over under a new worker id: its runs were handed over and are fenced out already.
    """
    clear(settings.ready_file)  # a dead predecessor's (the same container), before any wait
    while True:
        async with open_backends(settings, new_worker_id("brain")) as backends:
            code = await run(backends, settings, killpoints, stop, on_ready=lambda http: settle_heap())
        if code != RESTART or stop.is_set():
            return 0 if code == RESTART else code
        log.warning("starting_over", reason="presumed dead by the other Brains")


# What :func:`run` returns when this Brain was presumed dead: start over under a new id.
RESTART = -1


@asynccontextmanager
async def serve_api(
    settings: Settings, ctx: BrainContext, served: Served | None = None, backends: Backends | None = None
) -> AsyncIterator[str | None]:
    """The HTTP API of this Brain, while the block runs (``TENDON_HTTP``; its address in use is an
    error only when it was asked for); yields where it listens."""
    where = http_address(settings.http)  # off: the API package (FastAPI) is not even imported
    if where is None:
        yield None
        return
    from brain.api import Api, Tokens
    from brain.api.mcp_face import load_agents
    from brain.api.server import serving
    from brain.verbs import KnownTools

    api = Api(
        store=ctx.store,
        tokens=Tokens(settings.api_tokens, settings.operator_tokens, settings.namespace),
        topology=ctx.topology,
        wake_channel=ctx.wake_channel,
        previews=ctx.previews,
        endings=ctx.endings,
        metrics=ctx.metrics,
        controls=ctx.controls.send,
        codec=ctx.codec,
        served=served.submit if served is not None else None,
        transport=backends.transport if backends is not None else None,
        edits=ctx.threads.forget if backends is not None and backends.follows_edits else None,
        tools=KnownTools(served=backends.served_tools if backends is not None else None),
        mcp_agents=load_agents(settings.mcp_agents),
        max_request_bytes=settings.max_request_bytes,
        webhook_private=settings.webhook_private,
    )
    if api.tokens.open:
        log.warning(
            "http_api_open",
            reason=f"no TENDON_API_TOKENS: every request acts in namespace {settings.namespace}",
        )
    async with serving(api, where, required="http" in settings.model_fields_set) as port:
        yield None if port is None else f"{where[0]}:{port}"


async def released(
    store: BrainStore, channel: str, metrics: BrainMetrics, conn: Connection, gone: Any, died: bool
) -> int:
    """Hand back the turns of Brains presumed dead (or retiring): each one a recovery to count."""
    count = await store.turns.release_owners(conn, gone, channel, died=died)
    metrics.recoveries.labels("brain_died" if died else "brain_retired").inc(count)
    return count


def horizons(store: BrainStore, settings: Settings) -> list[Horizon]:
    return [
        # A session's journal may be long: a few sessions per transaction.
        Horizon("sessions", settings.retain_journal_days * DAY, store.retention.prune_journal, batch=20),
        Horizon("parked", settings.retain_parked_days * DAY, store.prune_parked),
    ]


async def cancel_child(ctx: BrainContext, namespace: str, turn_id: str, request_id: str) -> int:
    """Cancel a delegated child through the controls' verb (its running tools with it); the
    control's id. The request id makes asking again asking once."""
    receipt = await control(
        ctx.store, namespace=namespace, turn_id=turn_id, request_id=request_id, kind=Kind.CANCEL,
        topology=ctx.topology, wake_channel=ctx.wake_channel, ended=ctx.ended, send=ctx.controls.send,
    )  # fmt: skip
    return receipt.control_id


def first_look(settings: Settings) -> float:
    """When the repair scan first looks at a turn that waits for its tools: once a Brain that died
    right after committing its intents has been seen dead (its commands are then sent again)."""
    return max(2 * settings.scan_interval, settings.reconnect_grace + settings.scan_interval)


@dataclass
class Running:
    """What a running Brain is made of, by name: what its shutdown stops, in order."""

    ctx: BrainContext
    liveness: Liveness
    scheduler: Scheduler
    commands: CommandRelay
    updates: UpdateConsumer
    served: Served
    background: dict[str, asyncio.Task[None]]  # by name: the relays, the scan, the keepers, claims


async def run(
    backends: Backends,
    settings: Settings,
    killpoints: KillPoints,
    stop: asyncio.Event,
    on_ready: Callable[[str | None], object] | None = None,
) -> int:
    """Run a Brain on ``backends`` until ``stop`` is set; then stop and close in reverse order.
    ``on_ready`` is called once it serves, with the address its HTTP API listens on (None: none)
    (``serve`` settles the heap of the process it owns).

    Returns 0 after a requested stop, ``RESTART`` when the others presumed this Brain dead,
    1 when a background task ended on its own (which should never happen: it is logged and the
    process exits so a supervisor restarts it).
    """
    async with AsyncExitStack() as stack:
        brain = await _start(stack, backends, settings, killpoints)
        http = await stack.enter_async_context(serve_api(settings, brain.ctx, brain.served, backends))
        if on_ready is not None:
            on_ready(http)
        worker_id = brain.liveness.worker_id
        log.info("brain_ready", worker=worker_id, schema=settings.brain_schema, http=http)
        if settings.ready_file:  # says ready while its database and broker are up
            transport = backends.transport
            services = {"PostgreSQL": lambda: brain.liveness.up, "RabbitMQ": lambda: transport.connected}
            await stack.enter_async_context(ReadyFile(settings.ready_file, worker_id, services))
        crashed: list[asyncio.Task[None]] = []

        def on_task_end(task: asyncio.Task[None]) -> None:
            if not task.cancelled():
                log.error("background_task_ended", task=task.get_name(), error=repr(task.exception()))
                crashed.append(task)
                stop.set()

        for task in brain.background.values():
            task.add_done_callback(on_task_end)
        presumed_dead = asyncio.create_task(brain.liveness.lost.wait())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait([presumed_dead, stopping], return_when=asyncio.FIRST_COMPLETED)
        presumed_dead.cancel()
        stopping.cancel()
        for task in brain.background.values():
            task.remove_done_callback(on_task_end)
        await _stop(brain, settings)
    if crashed:
        return 1
    return RESTART if brain.liveness.lost.is_set() and not stop.is_set() else 0


async def _start(
    stack: AsyncExitStack, backends: Backends, settings: Settings, killpoints: KillPoints
) -> Running:
    """Take this Brain's liveness, then start its relays, scan, keepers, claims and consumers."""
    store, broker, channel = backends.store, backends.transport, wake_channel(settings)
    topology = broker.topology
    # The queues this Brain uses exist before anything runs: two first declares of a new
    # quorum queue at once (the scanner's look at the updates queue and its consumer's
    # declare) can make RabbitMQ drop the connection (see Broker.consume).
    for queue in (topology.updates, topology.bindings):
        await broker.declare(queue)
    wakeups = Wakeups()
    await backends.listen(channel, wakeups.hint)
    active: set[str] = set()
    metrics = BrainMetrics()
    liveness = await stack.enter_async_context(
        backends.register(
            lease_seconds=settings.lease_seconds,
            grace=settings.reconnect_grace,
            interval=settings.scan_interval,
            release=partial(released, store, channel, metrics),
            on_renew=lambda conn, me: store.turns.renew_leases(conn, me, active, settings.lease_seconds),
            presence=broker,
        )
    )
    bind_worker("brain", liveness.worker_id)
    tracing = stack.enter_context(open_tracing(settings.otlp_endpoint, "tendon-brain"))
    ctx = _context(backends, settings, killpoints, liveness.worker_id, active, metrics, tracing)
    scheduler = Scheduler(ctx, settings.concurrency, wakeups, settings.scan_interval)
    scanner = RepairScanner(
        ctx,
        gap_timeout=settings.gap_timeout,
        stall_seconds=settings.stall_seconds,
        interval=settings.scan_interval,
        waiting=broker.waiting,
        consumers=broker.consumers,
        publish=broker.publish_many,
        repair_attempts=settings.repair_attempts,
    )
    steps = {
        "command-relay": ctx.commands.run(),
        "control-relay": ctx.controls.run(),
        "repair-scan": scanner.run(),
        "schedules": ScheduleLoop(ctx, settings.scan_interval).run(),
        "webhooks": WebhookLoop(ctx, settings.scan_interval).run(),
        "delegations": DelegationLoop(ctx, settings.scan_interval, partial(cancel_child, ctx)).run(),
        "statistics": keep_statistics(store.pool),
        "retention": keep_pruned(store.transact, horizons(store, settings)),
        "claims": scheduler.run(),
    }
    background = {name: asyncio.create_task(step, name=name) for name, step in steps.items()}
    updates = UpdateConsumer(ctx, broker, scheduler)
    await broker.consume(updates.queue, updates.handle, prefetch=settings.concurrency * 8)
    bindings = BindingsConsumer(ctx, broker)
    await broker.consume(bindings.queue, bindings.handle, prefetch=8)
    # What the broker parks is read back, recorded and surfaced (infra.transport.parked).
    await ParkedConsumer(store, broker, updates.queue, updates.surface_parked).start()
    await ParkedConsumer(store, broker, bindings.queue).start()
    served = Served(ctx, scheduler.quiet, scheduler.adopt)
    return Running(ctx, liveness, scheduler, ctx.commands, updates, served, background)


def _context(
    backends: Backends,
    settings: Settings,
    killpoints: KillPoints,
    owner: str,
    active: set[str],
    metrics: BrainMetrics,
    tracing: Tracing,
) -> BrainContext:
    """What the parts of this Brain share (``brain.run.context``)."""
    store, broker = backends.store, backends.transport
    return BrainContext(
        store=store,
        codec=backends.codec,
        topology=broker.topology,
        killpoints=killpoints,
        commands=CommandRelay(broker),
        controls=ControlRelay(store, broker, interval=settings.scan_interval),
        owner=owner,
        wake_channel=wake_channel(settings),
        lease_seconds=settings.lease_seconds,
        binding_wait_seconds=settings.binding_wait_seconds,
        first_look=first_look(settings),
        active=active,
        metrics=metrics,
        tracing=tracing,
        foreign=run_foreign,
        agent_modules=tuple(m.strip() for m in settings.agent_modules.split(",") if m.strip()),
    )


async def _stop(brain: Running, settings: Settings) -> None:
    """No new runs, the runs in progress to their next commit, the background tasks, the last
    commands out."""
    lost = brain.liveness.lost.is_set()
    log.info("brain_stopping", presumed_dead=lost)
    # First no new runs: an update applied from now on wakes its turn without claiming it
    # for this Brain (a run that would never start here).
    brain.scheduler.close()
    # Runs in progress may reach their next commit (a model reply, the intents of tools) for
    # up to TENDON_DRAIN_SECONDS while the relays still publish; a Brain presumed dead is
    # fenced out already and stops at once. Nothing waits in memory, so cancelling mid-phase
    # only loses uncommitted work, which the next run redoes from the last committed phase.
    await brain.scheduler.stop(0.0 if lost else settings.drain_seconds)
    for task in brain.background.values():
        task.cancel()
    for task in brain.background.values():
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    if not lost:
        await brain.commands.flush()
    await brain.ctx.models.close()
    for committer in (brain.served.submits, brain.ctx.moves, brain.updates.applier):
        log.info("batch_sizes", stats=json.dumps(committer.stats(), sort_keys=True))
    claims = {"committer": "claims", "sizes": dict(brain.scheduler.claimed)}
    log.info(
        "batch_sizes", stats=json.dumps(claims, sort_keys=True),
        command_messages=brain.commands.messages, commands=brain.commands.published,
    )  # fmt: skip
