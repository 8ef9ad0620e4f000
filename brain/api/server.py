"""The HTTP API served by a Brain process (uvicorn, in the Brain's own event loop)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator

import uvicorn

from brain.api.app import Api, create_app
from infra.process.logging import get_logger
from protocol import TransientError

log = get_logger(__name__)


class _Server(uvicorn.Server):
    """uvicorn, leaving the process's signals to the Brain (it would take SIGTERM and SIGINT)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def listen(where: tuple[str, int]) -> socket.socket:
    """The API's socket, bound here so that an address in use is an OSError the caller handles
    (uvicorn would exit the process)."""
    family = socket.AF_INET6 if ":" in where[0] else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP,
    # and without it a keep-alive response waits for the client's delayed ACK (40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(where)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


@contextlib.asynccontextmanager
async def serving(api: Api, where: tuple[str, int], *, required: bool) -> AsyncIterator[int | None]:
    """Serve the API at ``where`` while the block runs; yields the port it listens on. An address
    in use is an error that names it when it was asked for (``required``), else a warning and no API."""
    try:
        sock = listen(where)
    except OSError as exc:
        if required:
            why = exc.strerror or str(exc)
            raise TransientError(f"cannot serve the HTTP API at {where[0]}:{where[1]}: {why}") from exc
        log.warning("http_api_not_served", address=f"{where[0]}:{where[1]}", error=str(exc))
        yield None
        return
    # httptools, not h11 (pure Python): about a tenth of the Brain's CPU per call at 50 turns in
    # flight, each submitted over HTTP (docs/benchmarks/NOTES.md, twenty-first round).
    app = create_app(api)
    config = uvicorn.Config(app, http="httptools", log_config=None, access_log=False, lifespan="off")
    config.load()  # here, so that a missing parser fails the start, not the server's task unseen
    server = _Server(config)
    mcp = getattr(app.state, "mcp", None)  # agents served as MCP tools: their server runs meanwhile
    async with mcp.running() if mcp is not None else contextlib.nullcontext():
        task = asyncio.create_task(server.serve(sockets=[sock]), name="http-api")
        port = sock.getsockname()[1]
        log.info("http_api_ready", address=f"{where[0]}:{port}")
        try:
            yield port
        finally:
            server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 5)
            sock.close()
