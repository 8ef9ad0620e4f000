"""One transport contract, run against RabbitMQ (``Broker``) and a SQLite file (``LocalBroker``).

Each test runs once per backend on real services, so the embedded mode cannot drift from the
distributed one (issue 3). The contract is written down in ``infra/transport/``.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from infra.transport import REASON_HEADER, Delivery, Transport
from infra.transport.broker import Broker, Topology
from infra.transport.localqueue import LocalBroker
from tests.support import Processes

LIMIT = 2  # delivery limit of every queue here: a message is handed out at most LIMIT + 1 times


@dataclass(frozen=True)
class Parked:
    message_id: str | None
    body: bytes
    headers: dict[str, Any]


@dataclass
class Backend:
    """How to open one implementation, and how to look into its dead-letter queues."""

    name: str
    topology: Topology
    open: Callable[[], Transport]  # a new transport: a new connection, or the file opened again
    dead_letters: Callable[[Transport, str, int], Awaitable[list[Parked]]]

    @property
    def queue(self) -> str:
        return self.topology.commands("conf")

    @property
    def other(self) -> str:
        return self.topology.controls("conf")


async def until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


class Inbox:
    """A handler that records every delivery, then does what the test says with it."""

    def __init__(self, then: Callable[[Delivery], Awaitable[None]] | None = None) -> None:
        self.deliveries: list[Delivery] = []
        self._then = then

    async def __call__(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)
        if self._then is not None:
            await self._then(delivery)

    @property
    def bodies(self) -> list[bytes]:
        return [d.body for d in self.deliveries]

    async def wait(self, count: int) -> None:
        await until(lambda: len(self.deliveries) >= count, f"{count} deliveries, got {self.bodies}")


async def ack(delivery: Delivery) -> None:
    await delivery.ack()


async def _local_dead_letters(transport: Transport, queue: str, count: int) -> list[Parked]:
    inbox = Inbox(ack)
    consumer = await transport.consume(Topology.dlq(queue), inbox, prefetch=count + 10)
    await inbox.wait(count)
    await consumer.close()
    return [Parked(d.message_id, d.body, dict(d.headers)) for d in inbox.deliveries]


@pytest.fixture(params=["rabbitmq", "local"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "local":
        path = tmp_path / "queues.sqlite3"
        topology = Topology("local")
        yield Backend(
            "local",
            topology,
            lambda: LocalBroker(path, topology, delivery_limit=LIMIT, poll_interval=0.05),
            _local_dead_letters,
        )
        return
    tendon = request.getfixturevalue("tendon")
    tendon.routes.add("conf")  # its queues are deleted at teardown
    topology = Topology(f"t-{tendon.suffix}")

    async def dead_letters(_: Transport, queue: str, count: int) -> list[Parked]:
        # Read with a connection of our own: a dead-letter queue has no consumer in Tendon.
        connection = await aio_pika.connect(tendon.amqp_url)
        async with connection:
            dlq = await (await connection.channel()).get_queue(Topology.dlq(queue))
            parked: list[Parked] = []

            async def drain() -> bool:
                while (m := await dlq.get(no_ack=True, fail=False)) is not None:
                    parked.append(Parked(m.message_id, m.body, dict(m.headers)))
                return len(parked) >= count

            deadline = time.monotonic() + 10
            while not await drain():
                assert time.monotonic() < deadline, f"{count} dead letters expected, got {parked}"
                await asyncio.sleep(0.02)
            return parked

    yield Backend(
        "rabbitmq",
        topology,
        lambda: Broker(tendon.amqp_url, topology, delivery_limit=LIMIT),
        dead_letters,
    )


async def test_messages_are_delivered_in_the_order_they_were_published(backend: Backend) -> None:
    async with backend.open() as transport:
        for i in range(5):
            await transport.publish(backend.queue, f"m{i}".encode(), message_id=f"id-{i}")
        inbox = Inbox(ack)
        consumer = await transport.consume(backend.queue, inbox, prefetch=1)
        await inbox.wait(5)
        await consumer.close()
    assert inbox.bodies == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert [d.message_id for d in inbox.deliveries] == [f"id-{i}" for i in range(5)]


async def test_publish_keeps_the_message_id_and_headers(backend: Backend) -> None:
    async with backend.open() as transport:
        await transport.publish(backend.queue, b"x", message_id="mid", headers={"k": "v"})
        inbox = Inbox(ack)
        consumer = await transport.consume(backend.queue, inbox, prefetch=1)
        await inbox.wait(1)
        await consumer.close()
    (delivery,) = inbox.deliveries
    assert (delivery.message_id, delivery.headers.get("k"), delivery.processed) == ("mid", "v", True)


async def test_an_acked_message_is_never_delivered_again(backend: Backend) -> None:
    async with backend.open() as transport:
        await transport.publish(backend.queue, b"first", message_id="1")
        inbox = Inbox(ack)
        consumer = await transport.consume(backend.queue, inbox, prefetch=1)
        await inbox.wait(1)
        await consumer.close()
        # A later message arrives first in a new consumer only if the acked one is gone.
        await transport.publish(backend.queue, b"second", message_id="2")
        later = Inbox(ack)
        consumer = await transport.consume(backend.queue, later, prefetch=1)
        await later.wait(1)
        await consumer.close()
    assert later.bodies == [b"second"]


async def test_a_delivery_is_settled_once_and_its_consumer_goes_on(backend: Backend) -> None:
    # Given a handler that acks, then tries to settle the same delivery three more ways
    refused: list[str] = []

    async def settle_again(delivery: Delivery) -> None:
        await delivery.ack()
        for settle in (delivery.ack, delivery.nack, delivery.reject):
            try:
                await settle()
            except Exception as exc:  # noqa: BLE001 - what each backend raises is its own
                refused.append(type(exc).__name__)

    async with backend.open() as transport:
        await transport.publish(backend.queue, b"one", message_id="1")
        inbox = Inbox(settle_again)
        consumer = await transport.consume(backend.queue, inbox, prefetch=1)
        await inbox.wait(1)
        # When the next message comes (RabbitMQ closes a channel that settles a delivery twice)
        await transport.publish(backend.queue, b"two", message_id="2")
        await inbox.wait(2)
        await consumer.close()
    # Then every second settling was refused here, and the same consumer got the next message
    assert len(refused) == 6 and inbox.bodies == [b"one", b"two"]
    assert all(d.processed for d in inbox.deliveries)


async def test_a_nacked_message_with_requeue_is_delivered_again_before_later_ones(backend: Backend) -> None:
    async def nack_first_time(delivery: Delivery) -> None:
        if len(inbox.deliveries) == 1:
            await delivery.nack(requeue=True)
        else:
            await delivery.ack()

    async with backend.open() as transport:
        await transport.publish(backend.queue, b"a", message_id="a")
        await transport.publish(backend.queue, b"b", message_id="b")
        inbox = Inbox(nack_first_time)
        consumer = await transport.consume(backend.queue, inbox, prefetch=1)
        await inbox.wait(3)
        await consumer.close()
    assert inbox.bodies == [b"a", b"a", b"b"]
    assert inbox.deliveries[1].headers.get("x-delivery-count") == 1


async def test_a_message_past_the_delivery_limit_goes_to_the_dead_letter_queue(backend: Backend) -> None:
    async def always_nack(delivery: Delivery) -> None:
        if delivery.body == b"poison":
            await delivery.nack(requeue=True)
        else:
            await delivery.ack()

    async with backend.open() as transport:
        await transport.publish(backend.queue, b"poison", message_id="p", headers={"k": "v"})
        inbox = Inbox(always_nack)
        consumer = await transport.consume(backend.queue, inbox, prefetch=1)
        parked = await backend.dead_letters(transport, backend.queue, 1)
        await transport.publish(backend.queue, b"next", message_id="n")
        await inbox.wait(LIMIT + 2)
        await consumer.close()
    assert inbox.bodies == [b"poison"] * (LIMIT + 1) + [b"next"]
    assert (parked[0].message_id, parked[0].body, parked[0].headers["k"]) == ("p", b"poison", "v")
    assert parked[0].headers["x-first-death-reason"] == "delivery_limit"
    assert parked[0].headers["x-first-death-queue"] == backend.queue


async def test_a_rejected_message_goes_to_the_dead_letter_queue(backend: Backend) -> None:
    async def reject(delivery: Delivery) -> None:
        await delivery.reject(requeue=False)

    async with backend.open() as transport:
        await transport.publish(backend.queue, b"bad", message_id="r")
        consumer = await transport.consume(backend.queue, Inbox(reject), prefetch=1)
        parked = await backend.dead_letters(transport, backend.queue, 1)
        await consumer.close()
    assert (parked[0].message_id, parked[0].body) == ("r", b"bad")
    assert parked[0].headers["x-first-death-reason"] == "rejected"


async def test_dead_letter_parks_the_message_with_its_reason_and_acks_it(backend: Backend) -> None:
    async with backend.open() as transport:

        async def park(delivery: Delivery) -> None:
            await transport.dead_letter(backend.queue, delivery, "schema_error: no kind")

        await transport.publish(backend.queue, b"{}", message_id="d", headers={"k": "v"})
        inbox = Inbox(park)
        consumer = await transport.consume(backend.queue, inbox, prefetch=1)
        parked = await backend.dead_letters(transport, backend.queue, 1)
        await transport.publish(backend.queue, b"next", message_id="n")
        await inbox.wait(2)
        await consumer.close()
    assert (parked[0].message_id, parked[0].body) == ("d", b"{}")
    assert parked[0].headers[REASON_HEADER] == "schema_error: no kind"
    assert parked[0].headers["k"] == "v"
    assert inbox.bodies == [b"{}", b"next"]  # acked: not delivered again


async def test_dead_letter_parks_one_command_of_a_batch_alone_under_its_own_message_id(
    backend: Backend,
) -> None:
    # A command of a batch message is a delivery of another kind (``hands.run.parts.Part``): parking it
    # copies it alone, with the batch's headers and the reason, and settles only that part.
    from hands.run.parts import Part
    from tests.test_envelopes import make

    command = make("execute")
    part = Part(command, {"k": "v"})  # type: ignore[arg-type]
    async with backend.open() as transport:
        await transport.dead_letter(backend.queue, part, "schema_error: bad digest")
        parked = await backend.dead_letters(transport, backend.queue, 1)
    assert part.processed and not part.handed_back
    assert (parked[0].message_id, parked[0].body) == (command.message_id, part.body)
    assert parked[0].headers[REASON_HEADER] == "schema_error: bad digest" and parked[0].headers["k"] == "v"


async def test_publish_many_confirms_every_item_on_every_queue(backend: Backend) -> None:
    items = [(backend.queue if i % 2 else backend.other, f"m{i}".encode(), f"id-{i}") for i in range(6)]
    async with backend.open() as transport:
        assert await transport.publish_many(items) == [None] * 6
        first, second = Inbox(ack), Inbox(ack)
        consumers = [
            await transport.consume(backend.queue, first, prefetch=10),
            await transport.consume(backend.other, second, prefetch=10),
        ]
        await first.wait(3)
        await second.wait(3)
        for consumer in consumers:
            await consumer.close()
    assert first.bodies == [b"m1", b"m3", b"m5"]
    assert second.bodies == [b"m0", b"m2", b"m4"]


async def test_prefetch_bounds_the_unsettled_deliveries_of_a_consumer(backend: Backend) -> None:
    async with backend.open() as transport:
        for i in range(5):
            await transport.publish(backend.queue, f"m{i}".encode(), message_id=str(i))
        inbox = Inbox()  # holds every delivery unsettled
        consumer = await transport.consume(backend.queue, inbox, prefetch=2)
        await inbox.wait(2)
        await asyncio.sleep(0.3)  # room for a third delivery, if the bound were broken
        assert inbox.bodies == [b"m0", b"m1"]
        await inbox.deliveries[0].ack()  # one slot frees: exactly one more comes
        await inbox.wait(3)
        await asyncio.sleep(0.3)
        assert inbox.bodies == [b"m0", b"m1", b"m2"]
        for delivery in inbox.deliveries[1:]:
            await delivery.ack()
        await inbox.wait(5)
        await consumer.close()


async def test_waiting_counts_the_messages_that_no_consumer_holds(backend: Backend) -> None:
    async with backend.open() as transport:

        async def waiting_becomes(count: int) -> None:
            # RabbitMQ updates its count as deliveries leave; bounded wait, no fixed sleep
            deadline = time.monotonic() + 10
            while (now := await transport.waiting(backend.queue)) != count:
                assert time.monotonic() < deadline, f"waiting is {now}, expected {count}"
                await asyncio.sleep(0.02)

        await waiting_becomes(0)
        for i in range(3):
            await transport.publish(backend.queue, f"m{i}".encode(), message_id=str(i))
        await waiting_becomes(3)
        inbox = Inbox()  # holds its delivery unsettled
        consumer = await transport.consume(backend.queue, inbox, prefetch=1)
        await inbox.wait(1)
        await waiting_becomes(2)  # the one handed out no longer waits
        await inbox.deliveries[0].ack()
        await inbox.wait(2)
        await waiting_becomes(1)
        for delivery in inbox.deliveries[1:]:
            await delivery.ack()
        await inbox.wait(3)
        await inbox.deliveries[2].ack()
        await waiting_becomes(0)
        await consumer.close()


async def test_consumers_counts_who_serves_a_queue_right_now(backend: Backend) -> None:
    async with backend.open() as transport:
        await transport.declare(backend.queue)
        assert await transport.consumers(backend.queue) == 0
        consumer = await transport.consume(backend.queue, Inbox(ack), prefetch=1)
        assert await transport.consumers(backend.queue) == 1
        await consumer.close()
        # (a quorum queue forgets a consumer a moment after its channel closed)
        deadline = time.monotonic() + 10
        while await transport.consumers(backend.queue) != 0:
            assert time.monotonic() < deadline, "the closed consumer is still counted"
            await asyncio.sleep(0.05)


async def test_a_dead_letter_queue_can_be_consumed_through_the_transport_with_its_reasons(
    backend: Backend,
) -> None:
    # Given a message parked with a reason
    async with backend.open() as transport:
        await transport.publish(backend.queue, b"poison", message_id="p1")

        async def park(delivery: Delivery) -> None:
            await transport.dead_letter(backend.queue, delivery, "never works")

        consumer = await transport.consume(backend.queue, park, prefetch=1)
        # When whoever consumes the queue also consumes its dead-letter queue (infra.transport.parked)
        parked = Inbox(ack)
        reader = await transport.consume(Topology.dlq(backend.queue), parked, prefetch=4)
        await parked.wait(1)
        await reader.close()
        await consumer.close()
    # Then it reads the message with its reason, and the queues are declared the same way
    (delivery,) = parked.deliveries
    assert (delivery.body, delivery.message_id, delivery.headers[REASON_HEADER]) == (
        b"poison",
        "p1",
        "never works",
    )


async def test_closing_a_consumer_returns_its_unacked_deliveries_to_the_queue(backend: Backend) -> None:
    async with backend.open() as transport:
        for body in (b"a", b"b", b"c"):
            await transport.publish(backend.queue, body, message_id=body.decode())
        held = Inbox()
        consumer = await transport.consume(backend.queue, held, prefetch=5)
        await held.wait(3)
        await held.deliveries[1].ack()
        await consumer.close()
        assert consumer.is_closed
        again = Inbox(ack)
        consumer = await transport.consume(backend.queue, again, prefetch=5)
        await again.wait(2)
        await consumer.close()
    assert again.bodies == [b"a", b"c"]


async def test_deliveries_returned_by_closed_consumers_count_toward_the_delivery_limit(
    backend: Backend,
) -> None:
    async with backend.open() as transport:
        await transport.publish(backend.queue, b"crashy", message_id="c")
        for attempt in range(LIMIT + 1):
            held = Inbox()  # never settles, as if its worker died mid-handler
            consumer = await transport.consume(backend.queue, held, prefetch=1)
            await held.wait(1)
            assert held.deliveries[0].headers.get("x-delivery-count") == (attempt or None)
            await consumer.close()
        parked = await backend.dead_letters(transport, backend.queue, 1)
    assert (parked[0].body, parked[0].headers["x-first-death-reason"]) == (b"crashy", "delivery_limit")


async def test_messages_survive_reopening_the_transport_and_acked_ones_stay_gone(backend: Backend) -> None:
    async with backend.open() as transport:
        await transport.publish(backend.queue, b"acked", message_id="1")
        await transport.publish(backend.queue, b"held", message_id="2", headers={"k": "v"})
        await transport.publish(backend.queue, b"waiting", message_id="3")
        inbox = Inbox()
        await transport.consume(backend.queue, inbox, prefetch=2)
        await inbox.wait(2)
        await inbox.deliveries[0].ack()
    # Closed with "held" unsettled and "waiting" never delivered.
    async with backend.open() as transport:
        again = Inbox(ack)
        consumer = await transport.consume(backend.queue, again, prefetch=5)
        await again.wait(2)
        await consumer.close()
    assert again.bodies == [b"held", b"waiting"]
    assert (again.deliveries[0].message_id, again.deliveries[0].headers.get("k")) == ("2", "v")


# ---- the embedded mode only ---------------------------------------------------------------


async def test_a_local_handler_that_raises_gets_its_message_again(tmp_path: Path) -> None:
    async def fail_once(delivery: Delivery) -> None:
        if len(inbox.deliveries) == 1:
            raise RuntimeError("database away")
        await delivery.ack()

    async with LocalBroker(tmp_path / "q.sqlite3", Topology("local")) as broker:
        await broker.publish(broker.topology.commands("conf"), b"m", message_id="m")
        inbox = Inbox(fail_once)
        await broker.consume(broker.topology.commands("conf"), inbox, prefetch=1)
        await inbox.wait(2)
    assert inbox.bodies == [b"m", b"m"]


async def test_closing_the_local_broker_lets_running_handlers_finish_and_ack(tmp_path: Path) -> None:
    path, started = tmp_path / "q.sqlite3", asyncio.Event()

    async def slow(delivery: Delivery) -> None:
        started.set()
        await asyncio.sleep(0.2)
        await delivery.ack()

    async with LocalBroker(path, Topology("local")) as broker:
        await broker.publish(broker.topology.commands("conf"), b"slow", message_id="s")
        await broker.consume(broker.topology.commands("conf"), Inbox(slow), prefetch=1)
        await started.wait()
    async with LocalBroker(path, Topology("local")) as broker:
        await broker.publish(broker.topology.commands("conf"), b"marker", message_id="n")
        inbox = Inbox(ack)
        await broker.consume(broker.topology.commands("conf"), inbox, prefetch=1)
        await inbox.wait(1)
    assert inbox.bodies == [b"marker"]


_CHILD = """
import asyncio, sys
from pathlib import Path
from infra.transport.broker import Topology
from infra.transport.localqueue import LocalBroker

async def main(path, mode):
    async with LocalBroker(Path(path), Topology("local")) as broker:
        queue = broker.topology.commands("conf")
        if mode == "publish":
            await broker.publish(queue, b"from-cli", message_id="cli")
            return
        async def hold(delivery):
            print("got", delivery.body.decode(), flush=True)
            await asyncio.Event().wait()  # never settles: killed here
        await broker.consume(queue, hold, prefetch=1)
        await asyncio.Event().wait()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_a_local_consumer_sees_what_another_process_published_into_the_file(
    tmp_path: Path, processes: Processes
) -> None:
    path = tmp_path / "queues.sqlite3"
    async with LocalBroker(path, Topology("local"), poll_interval=0.05) as broker:
        inbox = Inbox(ack)
        await broker.consume(broker.topology.commands("conf"), inbox, prefetch=1)
        child = processes.start("publisher", ["-c", _CHILD, str(path), "publish"], {})
        assert await processes.wait_exit(child, timeout=15) == 0, processes.output(child)
        await inbox.wait(1)
    assert inbox.bodies == [b"from-cli"]


async def test_a_delivery_held_by_a_killed_process_is_delivered_again(
    tmp_path: Path, processes: Processes
) -> None:
    path = tmp_path / "queues.sqlite3"
    async with LocalBroker(path, Topology("local")) as broker:
        await broker.publish(broker.topology.commands("conf"), b"work", message_id="w")
    child = processes.start("consumer", ["-c", _CHILD, str(path), "consume"], {})
    await until(lambda: "got work" in processes.output(child), "the child to get the message", 15)
    child.send_signal(signal.SIGKILL)
    await processes.wait_exit(child, timeout=5)
    async with LocalBroker(path, Topology("local")) as broker:
        inbox = Inbox(ack)
        await broker.consume(broker.topology.commands("conf"), inbox, prefetch=1)
        await inbox.wait(1)
    assert inbox.bodies == [b"work"]
    assert inbox.deliveries[0].headers.get("x-delivery-count") == 1
