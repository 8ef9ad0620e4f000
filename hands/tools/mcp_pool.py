"""The MCP servers of a route as its tools: discovered when entered, watched while it runs.

A server's tool list may change while the pool runs. The pool hears of it from the server (the
``tools`` list-changed event: on a ``subscriptions/listen`` stream at 2026-07-28, the
``notifications/tools/list_changed`` notification before), or when it connects to a server again
(a stdio server that died and was started anew may list other tools), or every ``relist_seconds``
of its config (a server that never says), and lists the server's tools again. A tool whose
listing changed is a new binding (its version is a digest of the listing), announced through
``changed``; the binding it replaces is no longer served, so a thread pinned to it gets a routing
error for its next call and never calls the new tool in its place. A tool the server no longer
lists goes the same way; a new one is a new binding.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType

from hands.tools.mcp import McpTool, ParkTimes, ServerCalls, bind_tool
from hands.tools.mcp_client import McpConnection
from hands.tools.mcp_config import McpServerSpec
from hands.tools.registry import ToolLoadError
from infra.process.logging import get_logger

log = get_logger(__name__)
# Told of the tools a re-discovery added and those it took back (their bindings are not served).
OnChange = Callable[[list[McpTool], list[McpTool]], Awaitable[None]]
SETTLE = 0.2  # a burst of change notices is one re-listing


class McpTools:
    """The tools of the MCP servers ``specs`` for ``route``, discovered when entered; their
    connections live until it is left. ``on_change``: told of what a re-discovery changed (none:
    the tools stay as first discovered). ``park``: when a call's task is parked."""

    def __init__(
        self, route: str, specs: Sequence[McpServerSpec], on_change: OnChange | None = None,
        park: ParkTimes | None = None,
    ) -> None:  # fmt: skip
        self.route = route
        self.park = park
        self.specs = list(specs)
        self.on_change = on_change
        self.tools: list[McpTool] = []
        self._connections: list[McpConnection] = []
        self._dirty: dict[str, asyncio.Event] = {}
        self._watchers: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> McpTools:
        try:
            for spec in self.specs:
                await self._discover(spec)
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._close()

    async def _discover(self, spec: McpServerSpec) -> None:
        dirty = self._dirty[spec.name] = asyncio.Event()
        connection = McpConnection(spec, dirty.set if self.on_change is not None else None)
        self._connections.append(connection)
        calls = ServerCalls(connection, self.park)
        listed = await connection.list_tools()
        if not listed:
            raise ToolLoadError(f"MCP server {spec.name} ({spec.where}) lists no tools")
        taken = {t.name: t.server for t in self.tools}
        for one in listed:
            if one.name in taken:
                raise ToolLoadError(
                    f"MCP servers {taken[one.name]} and {spec.name} both list a tool named {one.name}: "
                    "serve them on different routes"
                )
        self.tools += self._bound(spec, calls, listed)
        dirty.clear()  # what it said while being listed is in this listing
        if self.on_change is not None:
            self._watchers.append(
                asyncio.create_task(self._watch(spec, calls), name=f"mcp-watch-{spec.name}")
            )

    def _bound(self, spec: McpServerSpec, calls: ServerCalls, listed: list[object]) -> list[McpTool]:
        names = {t.name for t in listed}  # type: ignore[attr-defined]
        tools = [bind_tool(self.route, spec, calls, one, names) for one in listed]
        for tool in tools:
            log.info(
                "mcp_tool_bound", server=spec.name, tool=tool.name, version=tool.binding.version,
                replay=tool.binding.replay_policy.value, idempotent=tool.idempotent,
                has_query=tool.query is not None,
            )  # fmt: skip
        return tools

    async def _watch(self, spec: McpServerSpec, calls: ServerCalls) -> None:
        """Lists the server's tools again each time it may have changed them."""
        dirty = self._dirty[spec.name]
        while True:
            with contextlib.suppress(TimeoutError):  # relist_seconds: time to look again anyway
                await asyncio.wait_for(dirty.wait(), spec.relist_seconds)
            await asyncio.sleep(SETTLE)
            dirty.clear()
            try:
                await self._rediscover(spec, calls)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the next notice (or reconnect) tries again
                log.warning("mcp_rediscovery_failed", server=spec.name, error=f"{type(exc).__name__}: {exc}")

    async def _rediscover(self, spec: McpServerSpec, calls: ServerCalls) -> None:
        listed = await calls.connection.list_tools()
        others = {t.name for t in self.tools if t.server != spec.name}
        clash = [t.name for t in listed if t.name in others]
        if clash:  # refused at start; now the server's new tools of those names are not served
            log.warning("mcp_tools_clash", server=spec.name, tools=clash)
        fresh = {
            t.binding.digest: t for t in self._bound(spec, calls, [t for t in listed if t.name not in others])
        }
        mine = [t for t in self.tools if t.server == spec.name]
        added = [t for digest, t in fresh.items() if digest not in {m.binding.digest for m in mine}]
        removed = [t for t in mine if t.binding.digest not in fresh]
        if not added and not removed:
            return
        gone = {t.binding.digest for t in removed}
        self.tools = [t for t in self.tools if t.binding.digest not in gone] + added
        log.info(
            "mcp_tools_changed", server=spec.name, added=[f"{t.name} {t.binding.version}" for t in added],
            removed=[f"{t.name} {t.binding.version}" for t in removed],
        )  # fmt: skip
        assert self.on_change is not None
        await self.on_change(added, removed)

    async def _close(self) -> None:
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        for connection in self._connections:
            await connection.close()
