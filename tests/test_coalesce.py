"""``infra.transport.coalesce``: what the broker connection writes in one turn of the loop leaves in one send,
in order, and nothing is held past a drain, a close or the loop's next turn. Over a real
loopback socket; the sends are counted where the wrapped writer hands bytes to its transport."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

import pytest

from infra.transport import Delivery, Topology
from infra.transport.broker import Broker
from infra.transport.coalesce import CoalescingWriter
from tests.support import TendonEnv


@asynccontextmanager
async def socket_pair() -> AsyncIterator[tuple[CoalescingWriter, list[bytes], asyncio.StreamReader]]:
    """A coalescing writer on a loopback connection, the chunks it sent, and the far end."""
    accepted: asyncio.Queue[asyncio.StreamReader] = asyncio.Queue()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put(reader)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, raw = await asyncio.open_connection("127.0.0.1", port)
    sent: list[bytes] = []
    write, writelines = raw.write, raw.writelines

    def counted_write(data: bytes) -> None:
        sent.append(bytes(data))
        write(data)

    def counted_writelines(data: Iterable[bytes]) -> None:
        chunks = list(data)
        sent.append(b"".join(chunks))
        writelines(chunks)

    raw.write = counted_write  # type: ignore[method-assign]
    raw.writelines = counted_writelines  # type: ignore[method-assign]
    far = await accepted.get()
    try:
        yield CoalescingWriter(raw), sent, far
    finally:
        raw.close()
        server.close()


async def test_frames_written_in_one_turn_leave_in_one_send_in_their_order() -> None:
    async with socket_pair() as (writer, sent, far):
        for frame in (b"ack-1;", b"ack-2;", b"publish-3;"):
            writer.write(frame)
        assert sent == []  # held until the loop turns
        await asyncio.sleep(0)
        assert sent == [b"ack-1;ack-2;publish-3;"]
        assert await far.readexactly(len(sent[0])) == sent[0]


async def test_a_lone_frame_leaves_at_the_next_turn_and_later_frames_in_a_send_of_their_own() -> None:
    async with socket_pair() as (writer, sent, far):
        writer.write(b"one;")
        await asyncio.sleep(0)
        writer.write(b"two;")
        await asyncio.sleep(0)
        assert sent == [b"one;", b"two;"]
        assert await far.readexactly(8) == b"one;two;"


async def test_frames_written_as_lines_queue_behind_what_is_held() -> None:
    async with socket_pair() as (writer, sent, far):
        writer.write(b"first;")
        writer.writelines([b"second;", b"third;"])
        await asyncio.sleep(0)
        assert sent == [b"first;second;third;"]
        assert await far.readexactly(len(sent[0])) == sent[0]


async def test_a_send_that_failed_in_the_loop_fails_the_next_call_once() -> None:
    async with socket_pair() as (writer, sent, _):

        def broken(data: Iterable[bytes]) -> None:
            raise ConnectionResetError("the socket went away")

        writer._writer.writelines = broken  # type: ignore[method-assign]
        writer.write(b"lost;")
        await asyncio.sleep(0)  # the flush fails in the loop's callback, not there
        with pytest.raises(ConnectionResetError):
            writer.write(b"next;")
        writer.write(b"after;")  # raised once: the caller (aiormq's writer) has heard it


@pytest.mark.parametrize("ending", ["drain", "close", "write_eof"])
async def test_whatever_waits_on_the_socket_or_ends_it_sends_what_is_held_first(ending: str) -> None:
    async with socket_pair() as (writer, sent, far):
        writer.write(b"held;")
        if ending == "drain":
            await writer.drain()
        else:
            getattr(writer, ending)()
        assert sent == [b"held;"]  # at once, not at the next turn
        await asyncio.sleep(0)
        assert sent == [b"held;"]  # and only once
        assert await far.readexactly(5) == b"held;"


async def test_the_broker_connection_sends_the_acks_of_one_moment_together(
    tendon: TendonEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a broker connection, whose sends are counted by how many frames each carried
    carried: list[int] = []
    flush = CoalescingWriter.flush

    def counted(self: CoalescingWriter) -> None:
        if self._held:
            carried.append(len(self._held))
        flush(self)

    monkeypatch.setattr(CoalescingWriter, "flush", counted)
    topology = Topology(tendon.prefix)
    queue = topology.updates
    bodies = [f'{{"n": {i}}}'.encode() for i in range(200)]
    received: list[bytes] = []
    done = asyncio.Event()

    async def handler(message: Delivery) -> None:
        received.append(message.body)
        await message.ack()
        if len(received) == len(bodies):
            done.set()

    async with Broker(tendon.amqp_url, topology) as broker:
        await broker.declare(queue)
        # When many messages are published at once, and consumed with room for all of them
        await asyncio.gather(*(broker.publish(queue, b, message_id=f"m-{i}") for i, b in enumerate(bodies)))
        carried.clear()  # the sends from here on: the consumer's set-up, then the acks
        await broker.consume(queue, handler, prefetch=256)
        await asyncio.wait_for(done.wait(), 20)
    # Then each arrives once, and the deliveries that came together were acked in shared sends
    assert sorted(received) == sorted(bodies)
    assert max(carried) > 1, carried
    assert len(carried) < len(bodies), carried  # one send an ack would be more than this
