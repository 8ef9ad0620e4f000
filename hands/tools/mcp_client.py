"""Connections to one MCP server, with the official ``mcp`` SDK: pooled, bounded, reopened.

A server gets ``connections`` links (one by default: MCP multiplexes calls on one session); a
call takes the next link in turn. Each link lives in a task of its own, because the SDK's client
is an anyio context that must be left by the task that entered it, and the execution tasks that
call through it come and go. A link whose server died (a stdio process that exited, an HTTP
session that broke) is dropped and the next call opens a new one: that is the reconnect. What
becomes of a call that was in flight is the caller's business (``hands.tools.mcp``): this module
only tells a call that was never sent (:class:`McpUnreachableError`) from one whose answer was
lost (:class:`McpConnectionLostError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

from hands.tools.mcp_config import McpServerSpec
from infra.process.logging import get_logger
from protocol import TendonError

log = get_logger(__name__)


class McpUnreachableError(TendonError):
    """The MCP server could not be reached: nothing was sent."""

    code = "mcp_unreachable"


class McpConnectionLostError(TendonError):
    """The connection broke while a call was in flight: the server may have acted."""

    code = "mcp_connection_lost"


def _headers(spec: McpServerSpec) -> dict[str, str]:
    """Header values from the environment, read now (never stored anywhere)."""
    missing = [var for var in spec.headers_from_env.values() if var not in os.environ]
    if missing:
        raise McpUnreachableError(
            f"MCP server {spec.name}: environment variable(s) {', '.join(missing)} "
            "for its headers are not set"
        )
    return {header: os.environ[var] for header, var in spec.headers_from_env.items()}


Changed = Callable[[], None]
LIST_CHANGED = "notifications/tools/list_changed"
LISTEN_TRIES = 5  # listen streams that fail in a row, with nothing heard, before the link stops asking
LISTEN_PAUSE = 1.0  # before the next listen stream: this, then twice as long each time (30 s at most)


def _noticing(changed: Changed) -> Callable[[Any], Awaitable[None]]:
    """A message handler that tells ``changed`` of a server's tool list change (the notification
    of the revisions before 2026-07-28; later ones say it on a ``subscriptions/listen`` stream)."""

    async def handler(message: Any) -> None:
        if getattr(message, "method", None) == LIST_CHANGED:
            changed()
        await asyncio.sleep(0)

    return handler


@asynccontextmanager
async def open_client(spec: McpServerSpec, changed: Changed | None = None) -> AsyncIterator[Any]:
    """An entered ``mcp.Client`` for ``spec`` (stdio: the server's process lives as long);
    ``changed`` is told when the server says its tool list changed."""
    from mcp import Client, StdioServerParameters  # the optional extra: imported when used
    from mcp.client.streamable_http import streamable_http_client

    from hands.tools.mcp_tasks import TasksExtension

    extensions = [TasksExtension()]
    more: dict[str, Any] = {"message_handler": _noticing(changed)} if changed is not None else {}

    if spec.command:
        params = StdioServerParameters(
            command=spec.command[0], args=list(spec.command[1:]), env=spec.env or None, cwd=spec.cwd
        )
        async with Client(params, cache=None, extensions=extensions, **more) as client:
            yield client
        return
    import httpx2

    timeout = httpx2.Timeout(30.0, read=None)  # a tool may take as long as it takes
    async with httpx2.AsyncClient(headers=_headers(spec), timeout=timeout) as http:
        transport = streamable_http_client(spec.url, http_client=http)
        async with Client(transport, cache=None, extensions=extensions, **more) as client:
            yield client


class _Link:
    """One open session to the server, held by its own task until closed or broken."""

    def __init__(self, spec: McpServerSpec, changed: Changed | None = None) -> None:
        self.spec = spec
        self.changed = changed
        self.client: Any = None
        self.broken = False
        self._opened = asyncio.Event()
        self._stop = asyncio.Event()
        self._error: BaseException | None = None
        self._task = asyncio.create_task(self._hold(), name=f"mcp-{spec.name}")

    async def _hold(self) -> None:
        try:
            async with open_client(self.spec, self.changed) as client:
                self.client = client
                self._opened.set()
                listening = asyncio.create_task(self._listen(client))
                try:
                    await self._stop.wait()
                finally:
                    listening.cancel()
                    await asyncio.gather(listening, return_exceptions=True)
        except BaseException as exc:  # noqa: BLE001 - reported to whoever waits to use it
            self._error = exc
        finally:
            self.client = None
            self.broken = True
            self._opened.set()

    async def _listen(self, client: Any) -> None:
        """Tell ``changed`` of the tool list changes a 2026-07-28 server sends on a
        ``subscriptions/listen`` stream (an earlier revision cannot: its notification comes to the
        message handler). A stream that ends is opened again after a pause, while the link lives;
        one that ends ``LISTEN_TRIES`` times in a row with nothing heard is given up (logged):
        the pool then hears of changes when it reconnects, or by ``relist_seconds``."""
        from mcp.client.subscriptions import ListenNotSupportedError

        if self.changed is None:
            return
        failures = 0
        while not self.broken:
            heard = False
            try:
                async with client.listen(tools_list_changed=True) as events:
                    async for _ in events:
                        heard = True
                        self.changed()
                said = "the stream ended"
            except ListenNotSupportedError:
                return
            except Exception as exc:  # noqa: BLE001 - said, then tried again (bounded)
                said = f"{type(exc).__name__}: {exc}"
            failures = 0 if heard else failures + 1
            if failures >= LISTEN_TRIES:
                log.warning("mcp_listen_given_up", server=self.spec.name, failures=failures, error=said)
                return
            log.info("mcp_listen_ended", server=self.spec.name, error=said)
            await asyncio.sleep(min(30.0, LISTEN_PAUSE * 2.0**failures))

    async def ready(self) -> Any:
        await self._opened.wait()
        if self.client is None:
            detail = f": {type(self._error).__name__}: {self._error}" if self._error else ""
            raise McpUnreachableError(
                f"cannot connect to MCP server {self.spec.name} ({self.spec.where}){detail}"
            )
        return self.client

    async def close(self) -> None:
        self.broken = True
        self._stop.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(self._task), 5.0)
        if not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class McpConnection:
    """The links to one server: at most ``spec.connections`` open at once, used in turn."""

    def __init__(self, spec: McpServerSpec, changed: Changed | None = None) -> None:
        self.spec = spec
        self.changed = changed  # told when the tool list may have changed (a notice, a reconnect)
        self._opened = 0
        self._links: list[_Link | None] = [None] * spec.connections
        self._turn = itertools.count()
        self._lock = asyncio.Lock()
        self._closed = False

    async def _client(self) -> tuple[_Link, Any]:
        slot = next(self._turn) % len(self._links)
        async with self._lock:  # one opener per moment: a dead server is not started twice at once
            if self._closed:
                raise McpUnreachableError(f"MCP server {self.spec.name}: the pool is shutting down")
            link = self._links[slot]
            if link is None or link.broken:
                if link is not None:
                    await link.close()
                link = self._links[slot] = _Link(self.spec, self.changed)
                self._opened += 1
                if self._opened > 1 and self.changed is not None:
                    self.changed()  # a server started again (or reconnected) may list other tools
        return link, await link.ready()

    async def list_tools(self) -> list[Any]:
        """Every tool the server lists (all pages). A connection that broke meanwhile is dropped
        (McpConnectionLostError), so the next listing starts the server again."""
        link, client = await self._client()
        tools: list[Any] = []
        cursor: str | None = None
        for _ in range(1000):  # bounded: a paginator that never ends
            with self._watching(link, "the listing of its tools"):
                page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                return tools
        raise McpUnreachableError(f"MCP server {self.spec.name} lists tools without end")

    async def call(self, name: str, arguments: dict[str, Any], meta: dict[str, Any]) -> Any:
        """``tools/call``: the server's ``CallToolResult`` (or ``TaskCreated`` raised: the server
        made a task of it), or an error that says whether it may have been sent. An ``MCPError``
        the server answered with is raised as it is."""
        link, client = await self._client()
        with self._watching(link, f"the call of {name}"):
            return await client.call_tool(name, arguments, meta=meta)

    async def task(self, method: str, task_id: str, responses: dict[str, Any] | None = None) -> Any:
        """``tasks/get`` (the task's state), ``tasks/cancel`` or ``tasks/update`` with
        ``responses`` (their acknowledgement)."""
        from pydantic import TypeAdapter

        from hands.tools import mcp_tasks as t

        link, client = await self._client()
        params = t.TaskParams(taskId=task_id)
        with self._watching(link, f"{method} of task {task_id}"):
            if method == "tasks/get":
                return await client.session.send_request(t.GetTask(params=params), t.TaskState)
            ack = TypeAdapter(dict[str, Any])
            if method == "tasks/update":
                update = t.UpdateTaskParams(taskId=task_id, inputResponses=responses or {})
                return await client.session.send_request(t.UpdateTask(params=update), ack)
            return await client.session.send_request(t.CancelTask(params=params), ack)

    @contextlib.contextmanager
    def _watching(self, link: _Link, what: str) -> Iterator[None]:
        """A request on ``link``: a connection that breaks meanwhile is McpConnectionLostError
        (and the link is dropped, so the next request opens another)."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        try:
            yield
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                raise
            link.broken = True
            raise McpConnectionLostError(
                f"the connection to MCP server {self.spec.name} closed during {what}"
            ) from exc
        except (OSError, EOFError, ConnectionError) as exc:
            link.broken = True
            raise McpConnectionLostError(
                f"the connection to MCP server {self.spec.name} broke during {what}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    async def close(self) -> None:
        async with self._lock:
            self._closed = True
            links, self._links = [x for x in self._links if x is not None], [None] * len(self._links)
        for link in links:
            await link.close()
