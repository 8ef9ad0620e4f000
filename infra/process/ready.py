"""The ready file (``TENDON_READY_FILE``): what tells a supervisor (a container's health check, a
test, a benchmark) that a Brain or Hands process serves now, not merely that it runs.

- It is removed first thing at start, before the process waits for its services: a process
  restarted in the same container (after a SIGKILL or an out-of-memory kill, which leave no
  chance to clean up) must not inherit the dead one's file and be taken as ready, under its id.
- It is written (the worker id, one line) once the process serves.
- It is removed while a service the process needs is lost (its database session, its broker
  connection) and written again once every one is back: a health check is a look at now, not a
  latch set once at start.
- It is removed at exit.

It is written whole under another name and renamed, so that its existence is the whole answer:
``test -f FILE`` is a health check (docker-compose.yml's).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

from infra.process.logging import get_logger

log = get_logger(__name__)

# How often the process looks at its services (seconds): well within a health check's interval.
LOOK_EVERY = 0.5


def clear(path: str | None) -> None:
    """Remove the ready file of an earlier process, if there is one (at start)."""
    if path:
        Path(path).unlink(missing_ok=True)


class ReadyFile:
    """``async with ReadyFile(path, worker_id, services)``: the file says ready while every
    service in ``services`` (a name, and whether it is up now) is up, until the block ends."""

    def __init__(
        self,
        path: str,
        worker_id: str,
        services: Mapping[str, Callable[[], bool]],
        *,
        interval: float = LOOK_EVERY,
    ) -> None:
        self.path = Path(path)
        self.worker_id = worker_id
        self.services = services
        self.interval = interval
        self.ready = False
        self.failing = False  # the last write failed (said once)
        self._watch: asyncio.Task[None] | None = None

    def lost(self) -> list[str]:
        """The services that are not up now."""
        return [name for name, up in self.services.items() if not up()]

    async def __aenter__(self) -> ReadyFile:
        await self._say(not self.lost())
        self._watch = asyncio.create_task(self._keep(), name="ready-file")
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        self.path.unlink(missing_ok=True)

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            lost = self.lost()
            if lost and self.ready:
                log.warning("not_ready", reason="a service it needs is lost", lost=lost)
            elif not lost and not self.ready:
                log.info("ready_again")
            await self._say(not lost)

    async def _say(self, ready: bool) -> None:
        """Make the file say ``ready``, whatever happened to it since the last look (another
        process given the same file may have removed it). A file that cannot be written is said
        once and tried again at the next look: the health check tells, the work goes on."""
        try:
            if ready and not (self.ready and self.path.exists()):
                # Written whole under another name, then renamed: a reader never finds half a file.
                part = self.path.with_name(self.path.name + ".part")
                await asyncio.to_thread(part.write_text, self.worker_id + "\n")
                await asyncio.to_thread(part.replace, self.path)
            elif not ready:
                self.path.unlink(missing_ok=True)
        except OSError as exc:
            if not self.failing:
                log.error("ready_file_not_written", path=str(self.path), error=repr(exc))
            self.failing = True
            return
        self.failing = False
        self.ready = ready
