"""Waiting at start for the services a server needs, instead of exiting.

Containers start in any order: a Brain or a Hands worker may come up before PostgreSQL accepts
connections, before RabbitMQ has booted, or before MinIO answers. ``brain serve`` and ``hands
serve`` then wait with backoff (``TENDON_SERVICE_WAIT_SECONDS``, forever by default) and say
every few seconds what they wait for. Only "not there yet" is waited out: a refused login or a
bad request is a configuration error, reported at once. The CLI verbs wait for nothing: a user
who typed a command learns at once that a service is away.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar
from urllib.parse import urlsplit

import asyncpg
from aiormq.exceptions import ProbableAuthenticationError

from infra.process.logging import get_logger
from protocol import TransientError

log = get_logger(__name__)

T = TypeVar("T")

# A line says what the process waits for at the first failure and then this often (seconds).
SAY_EVERY = 5.0
# Backoff between attempts: from the first to the last, doubling.
FIRST_PAUSE, LAST_PAUSE = 0.2, 3.0


def not_there_yet(exc: BaseException) -> bool:
    """Whether ``exc`` says a service is not (yet) reachable, as opposed to refusing us."""
    if isinstance(exc, ProbableAuthenticationError):  # an OSError too, but a wrong password
        return False
    # Refused, unresolvable (a container's name before it exists), timed out, dropped; PostgreSQL
    # "the database system is starting up"; an object store that is away or answers 5xx.
    return isinstance(
        exc, OSError | asyncpg.CannotConnectNowError | asyncpg.PostgresConnectionError | TransientError
    )


def _said(exc: BaseException) -> str:
    """What a connection's error says: ``Type: message`` (a TransientError's message alone)."""
    if isinstance(exc, TransientError):
        return exc.message
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def where(url: str) -> str:
    """``host:port`` of a service URL, never its credentials (for the log line)."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    return f"{host}:{parts.port}" if parts.port else host


async def wait_for(
    connect: Callable[[], Awaitable[T]], *, service: str, url: str, patience: float = math.inf
) -> T:
    """``await connect()``, trying again while ``service`` is not there yet, for ``patience``
    seconds at most; then a ``TransientError`` that names the service and its address (a refused
    connection or an unknown host does not say which service it was) with the last error."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    say_at = started
    pause = FIRST_PAUSE
    while True:
        try:
            return await connect()
        except Exception as exc:
            waited = loop.time() - started
            if not not_there_yet(exc):
                raise
            if waited >= patience:
                raise TransientError(f"cannot reach {service} at {where(url)}: {_said(exc)}") from exc
            if loop.time() >= say_at:
                log.warning(
                    "waiting_for_service",
                    service=service,
                    at=where(url),
                    waited_seconds=round(waited, 1),
                    error=f"{type(exc).__name__}: {exc}",
                )
                say_at = loop.time() + SAY_EVERY
            await asyncio.sleep(min(pause * random.uniform(0.8, 1.2), max(0.0, patience - waited)))
            pause = min(LAST_PAUSE, pause * 2)
