"""A Brain's Prometheus metrics: what it observes as it works (latencies, recoveries) and what
it reads of the record when scraped (turns and executions by state, relay lag, parked messages).

One registry per Brain (no process-global state): ``GET /metrics`` on its HTTP API renders it.
The state gauges count what the shared record holds, so every Brain of a deployment reports the
same values for them (aggregate with ``max``); the histograms and counters are this Brain's own
work (aggregate with ``sum``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from brain.rules.states import ExecutionStatus, TurnStatus
from brain.store.gauges import Gauges

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# How long one read of the record answers scrapes (several scrapers cost one read).
FRESH_SECONDS = 1.0

_FAST = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_SLOW = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 86400.0)


class _StateCollector(Collector):
    """The gauges read from the record, as of the last refresh."""

    def __init__(self) -> None:
        self.state = Gauges()

    def collect(self) -> Iterable[Metric]:
        s = self.state
        turns = GaugeMetricFamily("tendon_turns", "Turns in each state", labels=["status"])
        for status in TurnStatus:
            turns.add_metric([status.value], s.turns.get(status.value, 0))
        executions = GaugeMetricFamily(
            "tendon_executions", "Tool executions in each state", labels=["status"]
        )
        for e in ExecutionStatus:
            executions.add_metric([e.value], s.executions.get(e.value, 0))
        yield turns
        yield executions
        yield GaugeMetricFamily(
            "tendon_executions_unknown",
            "Executions whose effect cannot be confirmed: each waits for an operator's reconcile",
            value=s.executions.get(ExecutionStatus.UNKNOWN.value, 0),
        )
        yield GaugeMetricFamily(
            "tendon_outbox_lag_seconds",
            "Age of the oldest control (cancel) committed and not yet published",
            value=s.outbox_lag,
        )
        yield GaugeMetricFamily(
            "tendon_relay_lag_seconds",
            "Age of the oldest tool intent that no Hands worker has accepted yet",
            value=s.relay_lag,
        )
        parked = GaugeMetricFamily(
            "tendon_parked_messages",
            "Messages parked from the Brain's own queues (updates, bindings), by queue: what "
            "`brain parked` lists. A Hands pool's (its route's commands and controls) are in its "
            "ledger: `hands parked`",
            labels=["queue"],
        )
        for queue, count in sorted(s.parked.items()):
            parked.add_metric([queue], count)
        yield parked


class BrainMetrics:
    """The instruments of one Brain process and the registry that renders them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.turn_seconds = Histogram(
            "tendon_turn_seconds", "From a turn's acceptance to its end, by how it ended", ["status"],
            buckets=_SLOW, registry=r,
        )  # fmt: skip
        self.tool_seconds = Histogram(
            "tendon_tool_seconds", "From a tool call's committed intent to its outcome applied",
            ["tool", "status"], buckets=_SLOW, registry=r,
        )  # fmt: skip
        self.model_seconds = Histogram(
            "tendon_model_call_seconds", "Model calls, by whether they answered", ["outcome"], buckets=_SLOW,
            registry=r,
        )  # fmt: skip
        # Labelled once: a lookup by label on every model call cost more than the observation.
        self.model_replied = self.model_seconds.labels("replied")
        self.model_failed = self.model_seconds.labels("failed")
        self.apply_seconds = Histogram(
            "tendon_update_apply_seconds",
            "From a Hands update's arrival at this Brain to the commit that applies it", buckets=_FAST,
            registry=r,
        )  # fmt: skip
        self.recoveries = Counter(
            "tendon_recoveries", "Work this Brain took over after a fault, by kind", ["kind"], registry=r
        )
        self._state = _StateCollector()
        r.register(self._state)
        self._read_at = float("-inf")

    def turn_ended(self, status: str, created_at: datetime | None) -> None:
        if created_at is not None:
            self.turn_seconds.labels(status).observe(_since(created_at))

    def tool_ended(self, tool: str, status: str, created_at: datetime | None) -> None:
        if created_at is not None:
            self.tool_seconds.labels(tool, status).observe(_since(created_at))

    async def render(self, read: Callable[[], Awaitable[Gauges]]) -> bytes:
        """The exposition text, with the state gauges read again when older than FRESH_SECONDS."""
        if time.monotonic() - self._read_at > FRESH_SECONDS:
            self._state.state = await read()
            self._read_at = time.monotonic()
        return generate_latest(self.registry)


def _since(moment: datetime) -> float:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, (datetime.now(UTC) - moment).total_seconds())
