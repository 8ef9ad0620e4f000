"""A TCP proxy on loopback that can drop every connection through it at once.

``async with TcpCutter(url) as proxy``: ``proxy.url`` is ``url`` with its host and port
replaced by the proxy's; ``proxy.cut()`` closes every connection made so far (both sides),
as a network fault would. New connections go through as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit, urlunsplit


class TcpCutter:
    def __init__(self, url: str) -> None:
        self._parts = urlsplit(url)
        self._target = (self._parts.hostname or "127.0.0.1", self._parts.port or 5672)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._pumps: set[asyncio.Task[None]] = set()
        self.cuts = 0

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        userinfo, _, _ = self._parts.netloc.rpartition("@")
        host = f"127.0.0.1:{port}"
        return urlunsplit(self._parts._replace(netloc=f"{userinfo}@{host}" if userinfo else host))

    def cut(self) -> None:
        """Drop every open connection now."""
        self.cuts += 1
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def __aenter__(self) -> TcpCutter:
        self._server = await asyncio.start_server(self._connected, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.cut()
        for task in list(self._pumps):
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        await self._server.wait_closed()

    async def _connected(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self._target)
        self._writers |= {client_w, server_w}
        pumps = [
            asyncio.create_task(self._pump(client_r, server_w)),
            asyncio.create_task(self._pump(server_r, client_w)),
        ]
        self._pumps.update(pumps)
        for task in pumps:
            task.add_done_callback(self._pumps.discard)

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
