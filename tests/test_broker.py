"""RabbitMQ-only behaviour of ``infra.transport.broker.Broker`` that the transport contract leaves open:
what a consumer's set-up does when the connection drops under it, a consumer's way back after a
reconnect, and how a publish goes out."""

from __future__ import annotations

import asyncio
from functools import partial

import aio_pika
import pytest

from chaos.proxy import TcpCutter
from infra.transport import Delivery, Topology
from infra.transport.broker import Broker
from infra.transport.quickack import deliver
from tests.support import TendonEnv


async def test_a_consumer_set_up_while_the_connection_drops_is_set_up_once_it_is_back(tendon: TendonEnv):
    # Given a broker connection whose TCP connection was just cut (as RabbitMQ itself closes
    # it when a consumer subscribes to a quorum queue that another declare is still starting)
    topology = Topology(tendon.prefix)
    queue = topology.updates
    received: asyncio.Queue[bytes] = asyncio.Queue()

    async def handler(message: Delivery) -> None:
        await received.put(message.body)
        await message.ack()

    async with TcpCutter(tendon.amqp_url) as proxy, Broker(proxy.url, topology) as broker:
        await broker.declare(queue)
        proxy.cut()
        # When a consumer is set up right then
        await asyncio.wait_for(broker.consume(queue, handler, prefetch=1), 20)
        # Then it is set up on the new connection and gets what is published
        await broker.publish(queue, b'{"n": 1}', message_id="m-1")
        assert await asyncio.wait_for(received.get(), 10) == b'{"n": 1}'
    assert proxy.cuts >= 1


async def test_a_publish_goes_out_persistent_and_one_the_broker_cannot_route_raises(tendon: TendonEnv):
    # Given a broker whose queue is declared
    topology = Topology(tendon.prefix)
    queue = topology.updates
    async with Broker(tendon.amqp_url, topology) as broker:
        await broker.publish(queue, b'{"n": 1}', message_id="m-1", headers={"x-note": "kept"})
        # Then what it published is persistent, with its id, type and headers
        raw = await aio_pika.connect(tendon.amqp_url)
        try:
            channel = await raw.channel()
            got = await (await channel.get_queue(queue, ensure=False)).get(timeout=5)
            assert got is not None
            await got.ack()
            assert (got.body, got.message_id, got.content_type) == (b'{"n": 1}', "m-1", "application/json")
            assert got.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
            assert got.headers["x-note"] == "kept"  # (RabbitMQ adds its x-delivery-count)
            # When the queue goes away behind its back (an operator deletes it)
            await channel.queue_delete(queue)
        finally:
            await raw.close()
        # Then a publish to it raises instead of being confirmed (the caller keeps the message)
        with pytest.raises(aio_pika.exceptions.PublishError):
            await asyncio.wait_for(broker.publish(queue, b'{"n": 2}', message_id="m-2"), 10)


async def test_a_nacked_publish_is_sent_again_until_the_queue_takes_it(tendon: TendonEnv) -> None:
    # Given a queue that nacks every publish for now (full, refusing: as a quorum queue another
    # process declared a moment before nacks while it starts), known to the broker as declared
    topology = Topology(tendon.prefix)
    queue = f"{tendon.prefix}.nacking"
    raw = await aio_pika.connect(tendon.amqp_url)
    try:
        channel = await raw.channel()
        refusing = {"x-max-length": 0, "x-overflow": "reject-publish"}
        await channel.declare_queue(queue, durable=True, arguments=refusing)
        async with Broker(tendon.amqp_url, topology) as broker:
            broker._declared.add(queue)
            # When a publish meets its nacks, and the queue takes messages again a moment later
            sending = asyncio.create_task(broker.publish(queue, b'{"n": 1}', message_id="m-1"))
            await asyncio.sleep(0.5)
            assert not sending.done()  # nacked, sent again, not given up
            await channel.queue_delete(queue)
            await channel.declare_queue(queue, durable=True)
            await asyncio.wait_for(sending, 10)
        # Then the message is there, once
        got = await (await channel.get_queue(queue, ensure=False)).get(timeout=5)
        assert got is not None and got.message_id == "m-1"
        await got.ack()
        assert await (await channel.get_queue(queue, ensure=False)).get(fail=False) is None
        await channel.queue_delete(queue)
    finally:
        await raw.close()


async def test_a_publish_cancelled_during_its_queues_first_declare_leaves_the_channel_usable(
    tendon: TendonEnv,
) -> None:
    # Given publishes whose queue the broker has not declared yet (a relay's first publish),
    # each cancelled a moment later: somewhere in its declare's calls to the broker
    for step in range(8):
        topology = Topology(f"{tendon.prefix}.c{step}")
        queue = topology.updates
        async with Broker(tendon.amqp_url, topology) as broker:
            publishing = asyncio.create_task(broker.publish(queue, b'{"n": 1}', message_id="m-1"))
            await asyncio.sleep(0.0005 * (step + 1))
            # When it is cancelled there (a worker stopping cancels its relay)
            publishing.cancel()
            await asyncio.gather(publishing, return_exceptions=True)

            # Then the publishing channel was not closed under it: the flush that follows at once
            # publishes (aio-pika closes a channel whose call was cancelled)
            await asyncio.wait_for(broker.publish(queue, b'{"n": 2}', message_id="m-2"), 10)
            raw = await aio_pika.connect(tendon.amqp_url)
            try:
                channel = await raw.channel()
                bodies = []
                source = await channel.get_queue(queue, ensure=False)
                while (got := await source.get(fail=False)) is not None:
                    bodies.append(got.body)
                    await got.ack()
                assert bodies[-1:] == [b'{"n": 2}']
                for name in (queue, topology.dlq(queue)):
                    await channel.queue_delete(name)
                await channel.exchange_delete(topology.dlx)
            finally:
                await raw.close()


async def test_a_consumer_takes_deliveries_again_after_its_connection_was_cut(tendon: TendonEnv):
    # Given a consumer that settled a delivery (aiormq's, handed to it straight)
    topology = Topology(tendon.prefix)
    queue = topology.updates
    received: asyncio.Queue[tuple[bytes, str | None]] = asyncio.Queue()

    async def handler(message: Delivery) -> None:
        await received.put((message.body, message.message_id))
        await message.ack()

    async with TcpCutter(tendon.amqp_url) as proxy, Broker(proxy.url, topology) as broker:
        await broker.consume(queue, handler, prefetch=4)
        await broker.publish(queue, b'{"n": 1}', message_id="m-1")
        assert await asyncio.wait_for(received.get(), 10) == (b'{"n": 1}', "m-1")
        await asyncio.sleep(0.3)  # its ack is written, not waited for
        # When its TCP connection is cut
        proxy.cut()

        async def publish_when_back() -> None:
            while True:
                try:
                    await broker.publish(queue, b'{"n": 2}', message_id="m-2")
                    return
                except Exception:  # noqa: BLE001 - not reconnected yet
                    await asyncio.sleep(0.2)

        # Then, reconnected, the restored consumer gets what is published next
        await asyncio.wait_for(publish_when_back(), 20)
        assert await asyncio.wait_for(received.get(), 20) == (b'{"n": 2}', "m-2")
    assert proxy.cuts >= 1


async def test_a_delivery_aio_pika_wraps_itself_is_settled_the_same_way(tendon: TendonEnv):
    # Given a consumer set up through aio-pika's own path (its recovery of a consumer the broker
    # cancelled goes that way), which hands the callback an IncomingMessage
    topology = Topology(tendon.prefix)
    queue = topology.updates
    received: asyncio.Queue[Delivery] = asyncio.Queue()

    async def handler(message: Delivery) -> None:
        await received.put(message)

    async with Broker(tendon.amqp_url, topology) as broker:
        await broker.declare(queue)
        raw = await aio_pika.connect(tendon.amqp_url)
        try:
            channel = await raw.channel()
            await (await channel.get_queue(queue, ensure=False)).consume(partial(deliver, handler))
            await broker.publish(queue, b'{"n": 1}', message_id="m-1", headers={"x-note": "kept"})
            # When it nacks the delivery with requeue, then acks it when it comes again
            first = await asyncio.wait_for(received.get(), 10)
            assert (first.body, first.message_id, first.headers["x-note"]) == (b'{"n": 1}', "m-1", "kept")
            await first.nack(requeue=True)
            assert first.processed
            with pytest.raises(aio_pika.exceptions.MessageProcessError):
                await first.ack()  # settled once only: twice would close the channel
            again = await asyncio.wait_for(received.get(), 10)
            assert again.message_id == "m-1"
            await again.ack()
            # Then the message is gone: nothing more comes
            await asyncio.sleep(0.5)
            assert received.empty()
            # And a delivery whose channel closed before it was settled cannot be settled on it
            await broker.publish(queue, b'{"n": 2}', message_id="m-2")
            late = await asyncio.wait_for(received.get(), 10)
            await channel.close()
            with pytest.raises(aio_pika.exceptions.ChannelInvalidStateError):
                await late.ack()
            assert not late.processed
        finally:
            await raw.close()
