"""What a Hands pool runs on: its ledger, its transport, its payload codec and its worker
registration. The embedded mode opens its own (SQLite, the local queue, a directory) and hands
them over; ``hands serve`` opens the distributed ones here (PostgreSQL, RabbitMQ, S3)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial

from hands.store import Ledger, ledger_for
from infra.db import create_pool, session_name
from infra.liveness import Liveness
from infra.liveness.registrations import WorkerRegistration
from infra.objects.payloads import PayloadCodec, open_payload_codec
from infra.process.settings import Settings
from infra.process.startup import wait_for
from infra.transport import Transport
from infra.transport.broker import Broker, Topology


@dataclass(frozen=True)
class HandsBackends:
    """What a pool runs on. Opened by someone else (the embedded mode), the app uses but never
    closes them; ``HandsApp`` opens the distributed ones itself (:func:`open_backends`)."""

    ledger: Ledger
    transport: Transport
    codec: PayloadCodec
    register: Callable[..., Liveness]  # the worker registration, given its options


@asynccontextmanager
async def open_backends(
    settings: Settings, topology: Topology, worker_id: str
) -> AsyncIterator[HandsBackends]:
    """The distributed backends of worker ``worker_id``, each waited for
    (``TENDON_SERVICE_WAIT_SECONDS``), closed in reverse order when the block ends. Every ledger
    session is named after the worker, so that the others end them all when they presume it dead."""
    s = settings
    patience = s.service_wait_seconds
    async with AsyncExitStack() as stack:
        pool = await wait_for(
            partial(
                create_pool,
                s.ledger_database_url,
                s.hands_schema,
                max_size=s.db_pool_size,
                name=session_name(worker_id),
            ),
            service="PostgreSQL",
            url=s.ledger_database_url,
            patience=patience,
        )
        stack.push_async_callback(pool.close)
        codec = await stack.enter_async_context(open_payload_codec(s, patience=patience))
        broker = await stack.enter_async_context(
            Broker(s.amqp_url, topology, delivery_limit=s.delivery_limit, patience=patience)
        )
        register = partial(
            WorkerRegistration, s.ledger_database_url, s.hands_schema, "hands", worker_id=worker_id
        )
        yield HandsBackends(ledger_for(pool), broker, codec, register)
