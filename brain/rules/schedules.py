"""Schedules (a pure rule): when a schedule fires next, and what a firing says.

A schedule submits a turn into a given thread on a cron expression (five fields, or six with the
seconds last: ``* * * * * *`` is every second; UTC), or once after a delay. Its row holds the time
it fires next; a Brain fires it in the commit that accepts its turn, under a request id made of the
schedule and that time (invariant 19), so a second Brain, or the same one after a restart, finds
the turn and never starts another. A time missed while no Brain ran fires once, late, and says so
(how late, and how many times it missed); the next time is the first one after now.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from croniter import croniter

from protocol import SchemaError

MAX_MISSED_COUNTED = 1000  # a schedule down for longer says "at least this many"
MAX_DELAY = 10 * 366 * 24 * 3600.0


def check(cron: str | None, delay: float | None) -> None:
    """Refuse a schedule that is not exactly one of a valid cron expression and a delay."""
    if (cron is None) == (delay is None):
        raise SchemaError("a schedule has either a cron expression or a delay (seconds), not both or neither")
    if cron is not None and (len(cron.split()) not in (5, 6) or not croniter.is_valid(cron)):
        raise SchemaError(
            f"{cron!r} is not a cron expression (five fields, or six with the seconds last; UTC)"
        )
    if delay is not None and not 0 <= delay <= MAX_DELAY:
        raise SchemaError(f"a schedule's delay is 0 to {MAX_DELAY:g} seconds, not {delay:g}")


def next_after(cron: str, after: datetime) -> datetime:
    """The first time of ``cron`` strictly after ``after``."""
    found: datetime = croniter(cron, after).get_next(datetime)
    return found


@dataclass(frozen=True)
class Firing:
    """What firing a schedule due at ``due`` does at ``now``: the fire's request id, the time it
    fires next (None: a once-schedule is done), and what the turn's accepted fact says of it."""

    request_id: str
    next_at: datetime | None
    said: dict[str, Any]


def firing(schedule_id: str, cron: str | None, due: datetime, now: datetime, tolerance: float) -> Firing:
    """The firing of a schedule due at ``due``; ``tolerance``: seconds late that count as on time
    (the scan's interval and a little)."""
    late = max(0.0, (now - due).total_seconds())
    missed = 0
    next_at = None
    if cron is not None:
        next_at = next_after(cron, due)
        while next_at <= now and missed < MAX_MISSED_COUNTED:
            missed += 1
            next_at = next_after(cron, next_at)
        if next_at <= now:
            next_at = next_after(cron, now)
    said: dict[str, Any] = {"id": schedule_id, "due_at": due.isoformat()}
    if late > tolerance:
        said |= {"late_seconds": round(late, 3), "missed": missed}
    return Firing(f"schedule:{schedule_id}:{due.isoformat()}", next_at, said)


def first_time(cron: str | None, delay: float | None, now: datetime) -> datetime:
    """When a new schedule fires first."""
    if cron is not None:
        return next_after(cron, now)
    assert delay is not None
    return now + timedelta(seconds=delay)
