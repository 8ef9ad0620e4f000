"""The physical floor: the same durable work as one Tendon tool call, by hand.

asyncpg and aio-pika only, no framework: per call

1. "Brain" commits the intent and its outbox row (one transaction),
2. publishes the command with a publisher confirm (durable quorum queue, persistent message),
3. "Hands" commits its ledger acceptance, then acks,
4. runs the (empty) tool, commits the result with its event-outbox row, publishes it with confirm,
5. "Brain" commits the result, then acks.

That is 4 commits and 2 confirmed publishes per call. Brain and Hands halves run in one
process here (on separate connections and channels); Tendon runs them in separate processes.
The ledger stamps its accept and outcome (``created_at``, ``updated_at``), as Tendon's does, so
that the latency scenario cuts both spans at the same commits (``stretches``).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import asyncpg

SCHEMA_SQL = """
CREATE TABLE {s}.intents (id text PRIMARY KEY, args jsonb NOT NULL, status text NOT NULL,
    result jsonb, created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz);
CREATE TABLE {s}.outbox (id bigserial PRIMARY KEY, message_id text NOT NULL, payload bytea NOT NULL);
CREATE TABLE {s}.ledger (id text PRIMARY KEY, status text NOT NULL, result jsonb,
    created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz);
CREATE TABLE {s}.events (id bigserial PRIMARY KEY, execution_id text NOT NULL, seq int NOT NULL,
    payload bytea NOT NULL);
"""


@dataclass
class Floor:
    """A running floor: schema, queues, the Hands and Brain consumers."""

    database_url: str
    amqp_url: str
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    latencies: list[float] = field(default_factory=list)
    server_latencies: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.schema = f"floor_{self.suffix}"
        self.commands = f"floor-{self.suffix}.commands"
        self.updates = f"floor-{self.suffix}.updates"
        self._waiters: dict[str, asyncio.Future[float]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Floor:
        self.pool = await asyncpg.create_pool(self.database_url, min_size=4, max_size=12)
        async with self.pool.acquire() as conn:
            await conn.execute(f'CREATE SCHEMA "{self.schema}"')
            await conn.execute(SCHEMA_SQL.format(s=self.schema))
        self.conn = await aio_pika.connect(self.amqp_url)
        self.pub = await self.conn.channel(publisher_confirms=True)
        args: dict[str, Any] = {"x-queue-type": "quorum"}
        for name in (self.commands, self.updates):
            await self.pub.declare_queue(name, durable=True, arguments=args)
        self.hands_ch = await self.conn.channel(publisher_confirms=True)
        await self.hands_ch.set_qos(prefetch_count=64)
        self.brain_ch = await self.conn.channel()
        await self.brain_ch.set_qos(prefetch_count=64)
        q_cmd = await self.hands_ch.get_queue(self.commands, ensure=False)
        q_upd = await self.brain_ch.get_queue(self.updates, ensure=False)
        await q_cmd.consume(self._spawn(self._on_command))
        await q_upd.consume(self._spawn(self._on_update))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for name in (self.commands, self.updates):
            ch = await self.conn.channel()
            await ch.queue_delete(name, if_unused=False, if_empty=False)
            await ch.close()
        await self.conn.close()
        async with self.pool.acquire() as conn:
            await conn.execute(f'DROP SCHEMA "{self.schema}" CASCADE')
        await self.pool.close()

    def _spawn(self, handler):  # type: ignore[no-untyped-def]
        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            task = asyncio.create_task(handler(message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        return on_message

    async def _publish(
        self, channel: aio_pika.abc.AbstractChannel, queue: str, body: bytes, mid: str
    ) -> None:
        msg = aio_pika.Message(body, message_id=mid, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        await channel.default_exchange.publish(msg, routing_key=queue)  # waits for the confirm

    async def _on_command(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        cmd = json.loads(message.body)
        s = self.schema
        async with self.pool.acquire() as conn:
            await conn.execute(
                f"INSERT INTO {s}.ledger (id, status) VALUES ($1, 'accepted') ON CONFLICT DO NOTHING",
                cmd["id"],
            )
        await message.ack()
        result = json.dumps({"n": cmd["args"].get("n", 0)})  # the tool: nothing
        event = json.dumps({"id": cmd["id"], "seq": 1, "result": json.loads(result)}).encode()
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                f"UPDATE {s}.ledger SET status = 'succeeded', result = $2, updated_at = now() WHERE id = $1",
                cmd["id"],
                result,
            )
            await conn.execute(
                f"INSERT INTO {s}.events (execution_id, seq, payload) VALUES ($1, 1, $2)", cmd["id"], event
            )
        await self._publish(self.hands_ch, self.updates, event, f"{cmd['id']}:1")

    async def _on_update(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        ev = json.loads(message.body)
        async with self.pool.acquire() as conn:
            took = await conn.fetchval(
                f"UPDATE {self.schema}.intents SET status = 'succeeded', result = $2, updated_at = now()"
                " WHERE id = $1 AND status = 'intended'"
                " RETURNING extract(epoch FROM now() - created_at)::float8",
                ev["id"],
                json.dumps(ev["result"]),
            )
        await message.ack()
        waiter = self._waiters.pop(ev["id"], None)
        if waiter is not None and not waiter.done():
            waiter.set_result(float(took or 0.0))

    async def call(self, n: int = 0, timeout: float = 30.0) -> float:
        """One durable tool call end to end; returns its wall-clock seconds."""
        t0 = time.perf_counter()
        eid = uuid.uuid4().hex
        payload = json.dumps({"id": eid, "args": {"n": n}}).encode()
        waiter: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiters[eid] = waiter
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                f"INSERT INTO {self.schema}.intents (id, args, status) VALUES ($1, $2, 'intended')",
                eid,
                json.dumps({"n": n}),
            )
            await conn.execute(
                f"INSERT INTO {self.schema}.outbox (message_id, payload) VALUES ($1, $2)", eid, payload
            )
        await self._publish(self.pub, self.commands, payload, eid)
        server = await asyncio.wait_for(waiter, timeout)
        took = time.perf_counter() - t0
        self.latencies.append(took)
        self.server_latencies.append(server)
        return took

    async def settle(self) -> None:
        """Analyze the floor's tables after its warm-up, as Tendon's are (bench.harness.settle)."""
        from bench.harness import settle

        await settle(self.database_url, [self.schema])

    async def stretches(self) -> dict[str, list[float]]:
        """The span of every call so far cut where the Hands' accept and outcome start, seconds
        (as ``TendonWorld.stretches`` cuts Tendon's; the floor's span starts at its intent)."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                f"SELECT extract(epoch FROM l.created_at - i.created_at)::float8 AS reply,"
                f" extract(epoch FROM l.updated_at - l.created_at)::float8 AS accept,"
                f" extract(epoch FROM i.updated_at - l.updated_at)::float8 AS outcome"
                f" FROM {self.schema}.intents i JOIN {self.schema}.ledger l USING (id)"
                f" WHERE i.status = 'succeeded'"
            )
        return {key: [float(r[key]) for r in rows] for key in ("reply", "accept", "outcome")}

    async def sequential(self, n: int) -> list[float]:
        """``n`` calls one after another; returns the server-side seconds of each."""
        start = len(self.server_latencies)
        for _ in range(n):
            await self.call()
        return self.server_latencies[start:]

    async def closed_loop(self, in_flight: int, duration: float) -> float:
        """Keep ``in_flight`` calls going for ``duration`` seconds; returns calls per second."""
        done = 0
        stop = time.perf_counter() + duration

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                await self.call()
                done += 1

        t0 = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(in_flight))), duration + 60)
        return done / (time.perf_counter() - t0)


async def _main() -> None:  # pragma: no cover - manual check
    from bench.harness import AMQP_URL, PG_ADMIN_URL

    async with Floor(PG_ADMIN_URL, AMQP_URL) as floor:
        lat = await floor.sequential(50)
        print("floor p50 ms", sorted(lat)[len(lat) // 2] * 1000)
        print("floor 10 in flight calls/s", await floor.closed_loop(10, 3))


if __name__ == "__main__":  # pragma: no cover
    asyncio.run(_main())
