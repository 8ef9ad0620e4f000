"""The one logger setup: JSON in containers, readable on a terminal."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog


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
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # The libraries underneath (asyncpg, aio-pika) log through the standard library: their
    # lines go out the same way, one line each, naming the process, never a bare traceback.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
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
