"""TCP proxies on loopback for fault injection: the shared plumbing, and one that cuts.

``LoopbackProxy`` listens on a free loopback port and forwards each connection to the
service a URL names; a subclass decides what to do with the bytes (``_connected``).
``TcpCutter`` forwards them as they are and can drop every connection through it at once,
as a network fault would (``cut()``), or hold every byte for a while, as a congested or
partitioned link would (``stall()``); new connections go through as before. Or it can play a
stopped service: every connection dropped and new ones refused (``go_down()``) until
``come_back()``. The chaos run
puts one in front of PostgreSQL and one in front of RabbitMQ; the tests use them too.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Self
from urllib.parse import urlsplit, urlunsplit


class LoopbackProxy:
    """``async with Proxy(url) as proxy``: ``proxy.url`` is ``url`` through the proxy.

    ``default_port``: where to connect when ``url`` names no port (each subclass's service).
    """

    default_port: int

    def __init__(self, url: str, port: int = 0) -> None:
        self._parts = urlsplit(url)
        self._port = port  # where to listen (0: a free port)
        self._target = (self._parts.hostname or "127.0.0.1", self._parts.port or self.default_port)
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        userinfo, at, _ = self._parts.netloc.rpartition("@")
        return urlunsplit(self._parts._replace(netloc=f"{userinfo}{at}127.0.0.1:{port}"))

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._connected, "127.0.0.1", self._port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._pumps):
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        await self._server.wait_closed()

    async def _connected(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def _spawn(self, *pumps: asyncio.Task[None]) -> None:
        """Track pump tasks so that leaving the ``async with`` cancels them."""
        self._pumps.update(pumps)
        for task in pumps:
            task.add_done_callback(self._pumps.discard)


class TcpCutter(LoopbackProxy):
    """A plain proxy (to RabbitMQ unless the URL says otherwise) with a ``cut()``."""

    default_port = 5672

    def __init__(self, url: str, port: int = 0) -> None:
        super().__init__(url, port)
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._down = False
        self.cuts = 0  # how many times ``cut()`` was called

    async def stall(self, seconds: float) -> None:
        """Hold every byte in both directions for ``seconds`` (connections stay open)."""
        self._flowing.clear()
        try:
            await asyncio.sleep(seconds)
        finally:
            self._flowing.set()

    def cut(self) -> None:
        """Drop every open connection now."""
        self.cuts += 1
        self._drop()

    def go_down(self) -> None:
        """Drop every open connection and refuse new ones, until ``come_back()``."""
        self._down = True
        self._drop()

    def come_back(self) -> None:
        self._down = False

    def _drop(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def __aexit__(self, *exc: object) -> None:
        self._drop()  # closing is not a cut: ``cuts`` counts only what a test asked for
        await super().__aexit__(*exc)

    async def _connected(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self._down:
            client_w.transport.abort()
            return
        try:
            server_r, server_w = await asyncio.open_connection(*self._target)
        except OSError:  # the service is down (a restart): the client sees its connection end
            client_w.transport.abort()
            return
        self._writers |= {client_w, server_w}
        self._spawn(
            asyncio.create_task(self._pump(client_r, server_w)),
            asyncio.create_task(self._pump(server_r, client_w)),
        )

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
