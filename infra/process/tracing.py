"""OpenTelemetry traces: a span per turn, per model call and per tool execution, one trace per
turn across Brain and Hands processes, exported by OTLP over HTTP when ``TENDON_OTLP_ENDPOINT``
is set (else nothing is recorded and nothing is carried: a no-op tracer).

A turn outlives processes (a Brain dies, another goes on), so no process can hold its span open.
Its ids are derived from the turn id instead: every run of every Brain parents its spans on the
same turn span, and whichever Brain sees the turn end records that span (from its acceptance to
its end) under those ids. A tool's command carries its parent as a W3C ``traceparent`` string in
the envelope (``trace``), so the Hands' execution span is a child of the Brain's model call that
asked for it.
"""

from __future__ import annotations

import contextvars
import hashlib
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import INVALID_SPAN, NonRecordingSpan, Span, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

_PROPAGATOR = TraceContextTextMapPropagator()
# The ids the next span takes (a turn's span, recorded under the ids its children already use).
_FORCED: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "tendon_span_ids", default=None
)


class _TurnIds(RandomIdGenerator):
    def generate_trace_id(self) -> int:
        forced = _FORCED.get()
        return forced[0] if forced else super().generate_trace_id()

    def generate_span_id(self) -> int:
        forced = _FORCED.get()
        return forced[1] if forced else super().generate_span_id()


def turn_ids(turn_id: str) -> tuple[int, int]:
    """The trace id and span id of a turn's span (the same in every process)."""
    digest = hashlib.sha256(turn_id.encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1


class Tracing:
    """The tracer of one process; ``enabled`` False: spans cost nothing and carry nothing."""

    def __init__(self, provider: TracerProvider | None) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("tendon") if provider else trace.NoOpTracer()

    @property
    def enabled(self) -> bool:
        return self.provider is not None

    def span(
        self, name: str, attributes: Mapping[str, AttributeValue], *, turn: str | None = None,
        traceparent: str | None = None,
    ) -> AbstractContextManager[Span]:  # fmt: skip
        """``name``'s span, current while the block runs: a child of the turn ``turn``'s span, or
        of the span an envelope's ``traceparent`` names (else a root). When not tracing, nothing:
        no parent is worked out and no context attached (this is on every model call's and tool
        run's path, where the no-op tracer's context handling was a sixth of their Python)."""
        if self.provider is None:
            return nullcontext(INVALID_SPAN)
        context = self.under_turn(turn) if turn is not None else self.parent(traceparent)
        return self.tracer.start_as_current_span(name, context=context, attributes=attributes)

    def under_turn(self, turn_id: str) -> Context:
        """A context whose current span is the turn's: what a run's spans are children of."""
        trace_id, span_id = turn_ids(turn_id)
        parent = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        return trace.set_span_in_context(NonRecordingSpan(parent))

    def turn_parent(self, turn_id: str) -> str | None:
        """The turn's span as a ``traceparent`` (for commands sent outside a model call)."""
        return self.carried(trace.get_current_span(self.under_turn(turn_id)))

    def carried(self, span: Span) -> str | None:
        """``span`` as a ``traceparent`` for an envelope (None when not tracing)."""
        if not self.enabled or not span.get_span_context().is_valid:
            return None
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        return carrier.get("traceparent")

    @staticmethod
    def parent(traceparent: str | None) -> Context | None:
        """The context an envelope's ``trace`` names (None: a root span)."""
        return _PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else None

    def turn_ended(self, turn_id: str, status: str, created_at: datetime | None) -> None:
        """Record the turn's span, from its acceptance to now, under the turn's own ids."""
        if not self.enabled or created_at is None:
            return
        if created_at.tzinfo is None:
            created_at = created_at.replace(tzinfo=UTC)
        token = _FORCED.set(turn_ids(turn_id))
        try:
            span = self.tracer.start_span(
                "turn", context=Context(), start_time=int(created_at.timestamp() * 1e9),
                attributes={"tendon.turn_id": turn_id, "tendon.status": status},
            )  # fmt: skip
        finally:
            _FORCED.reset(token)
        span.end()


@contextmanager
def open_tracing(endpoint: str | None, service: str) -> Iterator[Tracing]:
    """Tracing for this process while the block runs; spans still buffered are sent at its end."""
    if not endpoint:
        yield Tracing(None)
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider = TracerProvider(
        resource=Resource.create({"service.name": service}), id_generator=_TurnIds(), shutdown_on_exit=False
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=_traces_url(endpoint))))
    try:
        yield Tracing(provider)
    finally:
        provider.shutdown()


def _traces_url(endpoint: str) -> str:
    """OTLP's base endpoint (``http://host:4318``) or its traces URL, as given."""
    return endpoint if endpoint.rstrip("/").endswith("/v1/traces") else endpoint.rstrip("/") + "/v1/traces"
