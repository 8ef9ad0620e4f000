"""Wake-up hints over PostgreSQL LISTEN/NOTIFY, on a connection that comes back when lost.

Hints are never relied upon alone (a periodic scan repairs lost ones), but without them every
wake-up waits for that scan: so a lost connection is connected again with backoff, every
channel listened to again, and every callback given one hint at once, for whatever was
notified while nobody listened.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from types import TracebackType
from typing import Any

import asyncpg

from infra.process.logging import get_logger
from infra.process.loops import BackgroundLoop, Backoff

log = get_logger(__name__)

Callback = Callable[..., Any]  # asyncpg's (connection, pid, channel, payload)


class Listener:
    """``async with Listener(dsn) as listener: await listener.add(channel, callback)``."""

    def __init__(self, dsn: str, *, check_every: float = 0.2, name: str | None = None) -> None:
        self._dsn = dsn
        # The session's application_name: a worker's, so that its death ends this session too.
        self._settings = {"application_name": name} if name else None
        self._check_every = check_every
        self._conn: asyncpg.Connection | None = None
        self._callbacks: list[tuple[str, Callback]] = []
        self._watcher: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Listener:
        self._conn = await asyncpg.connect(self._dsn, timeout=10, server_settings=self._settings)
        watch = BackgroundLoop(
            "listener", self._check, period=self._check_every, first=self._check_every,
            backoff=Backoff(first=0.05, most=1.0),
        )  # fmt: skip
        self._watcher = asyncio.create_task(watch.run(), name="listener")
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()

    async def add(self, channel: str, callback: Callback) -> None:
        self._callbacks.append((channel, callback))
        if self._conn is not None and not self._conn.is_closed():
            await self._conn.add_listener(channel, callback)

    async def _check(self) -> None:
        """Connect again if the connection was lost (the database away: it raises, and the watch
        tries again), listen to every channel again, and give every callback its hint."""
        if self._conn is not None and not self._conn.is_closed():
            return
        self._conn = None
        try:
            self._conn = await asyncpg.connect(self._dsn, timeout=10, server_settings=self._settings)
            for channel, callback in self._callbacks:
                await self._conn.add_listener(channel, callback)
        except Exception:
            if self._conn is not None:
                self._conn.terminate()  # not every channel is listened to on it
                self._conn = None
            raise
        log.info("listener_restored")
        for channel, callback in self._callbacks:
            callback(None, 0, channel, "")
