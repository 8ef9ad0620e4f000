"""The faults the chaos run injects, the plan a seed makes of them, and the verdicts: plain
data and functions, tested without servers (tests/test_chaos_rules.py)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum


class Fault(StrEnum):
    BRAIN_KILL = "brain SIGKILL"
    HANDS_KILL = "hands SIGKILL mid-tool"
    BRAIN_STOP = "brain SIGSTOP past its lease, SIGCONT"
    HANDS_STOP = "hands SIGSTOP past its lease, SIGCONT"
    BRAIN_TERM = "brain SIGTERM (drain)"
    HANDS_TERM = "hands SIGTERM (drain)"
    PG_CUT = "PostgreSQL connections cut"
    PG_STALL = "PostgreSQL stalled"
    AMQP_CUT = "RabbitMQ connections cut"
    AMQP_STALL = "RabbitMQ stalled"
    PG_RESTART = "PostgreSQL restarted"
    AMQP_RESTART = "RabbitMQ restarted"


PROCESS_FAULTS = frozenset({Fault.BRAIN_KILL, Fault.HANDS_KILL, Fault.BRAIN_STOP, Fault.HANDS_STOP,
                            Fault.BRAIN_TERM, Fault.HANDS_TERM})  # fmt: skip
SERVICE_RESTARTS = frozenset({Fault.PG_RESTART, Fault.AMQP_RESTART})
# A quick run leaves the services running (other work may use them) and skips the waits of a
# frozen process; everything else it injects once.
QUICK = tuple(f for f in Fault if f not in SERVICE_RESTARTS | {Fault.BRAIN_STOP, Fault.HANDS_STOP})


def plan(seed: int, count: int, kinds: Sequence[Fault]) -> list[Fault]:
    """``count`` faults: every kind equally often (rounds of all kinds), each round in an order
    the seed shuffles, so that no kind always follows another."""
    if not kinds:
        raise ValueError("no fault kinds to inject")
    rng = random.Random(seed)
    out: list[Fault] = []
    while len(out) < count:
        round_ = list(kinds)
        rng.shuffle(round_)
        out.extend(round_)
    return out[:count]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), interpolated; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass
class Injected:
    """One fault: when it hit and was lifted (run clock); when the first turn that was in flight
    at it ended (``first``), and when the last did (``recovered``; a turn waiting on an UNKNOWN
    execution waits for a person, not for recovery); None: not within the wait."""

    kind: Fault
    at: float
    lifted: float
    first: float | None = None
    recovered: float | None = None
    target: str = ""

    @property
    def recovery(self) -> float | None:
        return None if self.recovered is None else max(0.0, self.recovered - self.lifted)

    @property
    def first_progress(self) -> float | None:
        return None if self.first is None else max(0.0, self.first - self.lifted)


@dataclass
class Tally:
    """What the counting services saw, by tool contract."""

    blind_resends: dict[str, int] = field(default_factory=dict)  # unsafe: posts beyond the first
    safe_reruns: int = 0  # allowed by the contract


def tally(posts: dict[str, int], tools: dict[str, str], safe: frozenset[str] = frozenset({"touch"})) -> Tally:
    """``posts``: POSTs per operation id (all mailboxes); ``tools``: operation id -> tool;
    ``safe``: the tools whose re-run is allowed."""
    t = Tally()
    for op, n in posts.items():
        if n <= 1:
            continue
        if tools.get(op) in safe:
            t.safe_reruns += n - 1
        else:  # an unsafe tool, or a post nothing here asked for: both are duplicates
            t.blind_resends[op] = n - 1
    return t


def by_kind(injected: Iterable[Injected]) -> dict[Fault, list[Injected]]:
    out: dict[Fault, list[Injected]] = {}
    for i in injected:
        out.setdefault(i.kind, []).append(i)
    return out
