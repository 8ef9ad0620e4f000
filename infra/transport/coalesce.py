"""Frames written to RabbitMQ in one turn of the event loop leave in one send.

aiormq's writer task hands each frame (an ack, a publish, a confirm's request) to the socket by
itself: one ``send`` system call each, with the whole loopback TCP path and the broker's wake-up
behind it. A group commit that answers a hundred callers at once makes a hundred acks or
publishes in one turn of the loop, and the writer wrote them one by one. Here the connection's
writer collects what it is given until the loop's next turn and sends it as one buffer. A lone
frame waits until the loop's next turn, no longer.

The hook is aiormq's own (``transport_factory``); aio-pika does not pass it through, so the
robust connection that aio-pika makes is told to (``CoalescingConnection``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from aio_pika import RobustConnection
from aiormq.connection import TCPTransportFactory, TLSTransportFactory, TransportFactory
from yarl import URL


class CoalescingWriter:
    """A ``StreamWriter`` whose writes within one turn of the loop go out as one. Whatever waits
    on the socket (``drain``) or ends it (``write_eof``, ``close``) sends what is held first, so
    frames keep their order and flow control still applies to every byte. A send that failed in
    the loop's callback fails the writer's next call, as it would have failed its own."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._held: list[bytes] = []
        self._failed: Exception | None = None
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        self._raise_failure()
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(data)

    def writelines(self, data: Iterable[bytes]) -> None:
        for chunk in data:
            self.write(chunk)

    def flush(self) -> None:
        if not self._held:
            return
        held, self._held = self._held, []
        if self._writer.is_closing():  # a closed socket would drop it all the same
            return
        try:
            # One call, one send: uvloop hands the buffers to the socket together, asyncio joins them.
            self._writer.writelines(held)
        except Exception as exc:  # noqa: BLE001 - raised by the writer's next call, not the loop's
            self._failed = exc

    async def drain(self) -> None:
        self.flush()
        self._raise_failure()
        await self._writer.drain()

    def write_eof(self) -> None:
        self.flush()
        self._writer.write_eof()

    def close(self) -> None:
        self.flush()
        self._writer.close()

    def _raise_failure(self) -> None:
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed

    def __getattr__(self, name: str) -> Any:  # the rest of StreamWriter, as it is
        return getattr(self._writer, name)


class CoalescingTransports(TransportFactory):
    """aiormq's own TCP or TLS connection, its writer wrapped in a :class:`CoalescingWriter`."""

    def __init__(self, tls: bool) -> None:
        self._inner: TransportFactory = TLSTransportFactory() if tls else TCPTransportFactory()

    async def create(self, url: URL, **kwargs: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await self._inner.create(url, **kwargs)
        return reader, CoalescingWriter(writer)  # type: ignore[return-value]  # duck-typed


class CoalescingConnection(RobustConnection):
    """aio-pika's robust connection (reconnects and all), over :class:`CoalescingTransports`."""

    def __init__(self, url: URL, loop: asyncio.AbstractEventLoop | None = None, **kwargs: Any) -> None:
        super().__init__(url, loop, **kwargs)
        self.kwargs["transport_factory"] = CoalescingTransports(tls=self.url.scheme == "amqps")
