"""Background loops: a step run every so often for as long as its process runs.

Every scanner, relay, keeper and pruner that repairs or maintains something in the background is
one of these. What they share is the rule of invariant 14: a step that fails (the database away,
the broker restarting) is weather, tried again on the next round; the loop ends only when its
task is cancelled (or, for a loop that has an end, when ``until`` says so), never because a step
raised. A failure is said at warning level on the 1st, the 10th and every 50th time in a row
(one line naming the loop, the count and the error), so that an outage shows at once and then
every now and then, not once a round.

Between rounds a loop waits its ``period``; after a failure it waits what ``backoff`` says (the
period, unless the loop has a backoff of its own); a loop that others may wake early (a hint
that there is work now) waits on its ``wake`` event as well.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from infra.process.logging import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class Backoff:
    """The pause after ``failures`` failures in a row: ``first * 2**failures``, at most ``most``."""

    first: float
    most: float

    def __call__(self, failures: int) -> float:
        # The exponent is bounded: 2**1024 times a float does not fit in a float, and a loop that
        # fails once a second reaches that count after a quarter of an hour of outage.
        return min(self.most, self.first * 2 ** min(failures, 64))


def worth_a_warning(failures: int) -> bool:
    """Whether the ``failures``-th failure in a row is said: the 1st, the 10th, every 50th."""
    return failures in (1, 10) or failures % 50 == 0


class BackgroundLoop:
    """Runs ``step`` until cancelled: ``first`` seconds after :meth:`run` starts (at once when
    0), then ``period`` seconds after each success and ``backoff(failures)`` seconds after each
    failure. ``wake`` (or :meth:`wake`) ends a wait early; the event is cleared after every wait.
    ``until``: asked before every wait, the loop returns once it says True. ``context``: more
    fields for the warning line (which worker, say)."""

    def __init__(
        self,
        name: str,
        step: Callable[[], Awaitable[object]],
        *,
        period: float,
        first: float = 0.0,
        backoff: Callable[[int], float] | None = None,
        wake: asyncio.Event | None = None,
        until: Callable[[], bool] | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self._step = step
        self.period = period
        self._first = first
        self._backoff = backoff
        self._wake = wake if wake is not None else asyncio.Event()
        self._until = until
        self._context = dict(context or {})
        self.failures = 0  # in a row, up to now

    def wake(self) -> None:
        """End the current wait (or the next one) now: there is work."""
        self._wake.set()

    async def run(self) -> None:
        pause = self._first
        waits = pause > 0
        while self._until is None or not self._until():
            if waits:
                # Not ``wait_for``: in Python 3.11 it swallows a cancel that comes as the event is
                # set, and the loop would outlive the task that was told to stop.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await self._wake.wait()
                self._wake.clear()
            waits = True
            try:
                await self._step()
            except Exception as exc:  # noqa: BLE001 - weather: the next round tries again
                self.failures += 1
                if worth_a_warning(self.failures):
                    said = {"loop": self.name, "failures": self.failures, "error": repr(exc)}
                    log.warning("loop_failed", **said, **self._context)
                pause = self.period if self._backoff is None else self._backoff(self.failures)
            else:
                self.failures = 0
                pause = self.period
