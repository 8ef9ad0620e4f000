"""The one logger setup: JSON in containers, readable on a terminal."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, MutableMapping
from typing import Any

import structlog

# Lines that a loop of its own (not an ``infra.process.loops.BackgroundLoop``, which says its
# failures on the 1st, 10th and every 50th time) or a request writes each time it fails while a
# service is lost: the database or the broker away made them come back every round, five to seven
# lines a second in all. Each is written once every ``REPEAT_EVERY`` seconds at most; the next one
# written says how many were held back (``repeated``). The libraries' own warnings (asyncpg's,
# aio-pika's) are held back the same way, by their first words.
RETRIED = frozenset({
    "api_request_unavailable", "claim_failed", "command_publish_failed", "consumer_setup_retry",
    "control_publish_failed", "event_publish_failed", "event_relay_round_failed",
    "localqueue_fetch_failed", "presence_unknown", "queue_depth_unknown", "read_ahead_failed",
})  # fmt: skip
REPEAT_EVERY = 5.0


class Repeats:
    """Which lines of a kind to write: the first, then one every ``every`` seconds."""

    def __init__(self, every: float = REPEAT_EVERY, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self.clock = clock
        self._seen: dict[tuple[str, ...], tuple[float, int]] = {}  # kind -> last written, held back

    def admit(self, kind: tuple[str, ...]) -> int | None:
        """None: hold this line back; else write it, saying that many were held back before it."""
        now = self.clock()
        written, held = self._seen.get(kind, (-self.every, 0))
        if now - written < self.every:
            self._seen[kind] = (written, held + 1)
            return None
        self._seen[kind] = (now, 0)
        return held

    def processor(self, _: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        """Tendon's own lines (a structlog processor)."""
        if event.get("event") in RETRIED:
            held = self.admit(("tendon", str(event["event"])))
            if held is None:
                raise structlog.DropEvent
            if held:
                event["repeated"] = held
        return event

    def filter(self, record: logging.LogRecord) -> bool:
        """The libraries' lines (a filter of the standard library's handler)."""
        if record.levelno < logging.WARNING or record.levelno > logging.ERROR:
            return True
        held = self.admit(("library", record.name, record.getMessage()[:40]))
        if held is None:
            return False
        record.repeated = held
        return True


def _repeated(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    record = event.get("_record")
    if getattr(record, "repeated", 0):
        event["repeated"] = record.repeated  # type: ignore[union-attr]
    return event


def configure_logging(fmt: str = "auto", level: str = "INFO", *, process: str | None = None) -> None:
    """Configure structlog once per process. ``auto`` picks console on a TTY, JSON otherwise.

    ``process`` (``brain``, ``hands``) is on every line, and so is the worker id once the
    process registered (``bind_worker``); turn and execution ids are bound with
    ``structlog.contextvars.bound_contextvars`` by the code that handles them, so every line
    inside carries them: a line says which process wrote it, and about what.
    """
    terminal = sys.stderr.isatty()
    if fmt == "auto":
        fmt = "console" if terminal else "json"
    # Colours only on a terminal: in a file they are escape codes nobody reads.
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=terminal)
        if fmt == "console"
        else structlog.processors.JSONRenderer()
    )

    def stamp(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        if process is not None:
            event.setdefault("process", process)
        if process in _workers:
            event.setdefault("worker", _workers[process])
        return event

    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        stamp,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    repeats = Repeats()
    structlog.configure(
        processors=[*shared, repeats.processor, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # The libraries underneath (asyncpg, aio-pika) log through the standard library: their
    # lines go out the same way, one line each, naming the process, never a bare traceback.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, _repeated],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    handler.addFilter(repeats.filter)
    root = logging.getLogger()
    root.handlers = [handler]
    # Their informational chatter ("Found credentials...") is not ours: warnings and up, unless
    # everything was asked for.
    numeric = logging.getLevelName(level.upper())
    root.setLevel(numeric if numeric <= logging.DEBUG else max(numeric, logging.WARNING))


# The worker id of each kind of process (one at a time: a process that starts over gets a new
# one). Lines are stamped with the one of the process's own kind, so the embedded mode, which
# runs a Brain and a Hands pool in one process with logging for neither, stamps none.
_workers: dict[str, str] = {}


def bind_worker(kind: str, worker_id: str) -> None:
    """Put ``worker_id`` on every log line of a ``kind`` process from now on."""
    _workers[kind] = worker_id


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)  # type: ignore[no-any-return]
