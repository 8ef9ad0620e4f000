"""Fixtures on real services: the local PostgreSQL and RabbitMQ (or TENDON_TEST_* URLs) and
an S3 API server (moto's server mode). Outside CI a missing service skips; under CI=true it
fails the run, because a skipped test is not a passing test."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import pytest

from tests.support import Processes, TendonEnv

pytest_plugins = ["tests.s3server"]

PG_URL = os.environ.get("TENDON_TEST_DATABASE_URL", "postgresql://root@127.0.0.1:5432/test")
AMQP_URL = os.environ.get("TENDON_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")


def _unavailable(what: str, exc: BaseException) -> None:
    message = f"{what} is not reachable: {exc}"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


async def _probe_pg() -> None:
    conn = await asyncpg.connect(PG_URL, timeout=5)
    await conn.close()


async def _probe_amqp() -> None:
    conn = await aio_pika.connect(AMQP_URL, timeout=5)
    await conn.close()


def _run_probe(probe: Callable[[], Coroutine[Any, Any, None]]) -> None:
    # On its own thread: the fixture may be first asked for from inside a running loop.
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, probe()).result()


@pytest.fixture(scope="session")
def pg_url() -> str:
    try:
        _run_probe(_probe_pg)
    except Exception as exc:  # noqa: BLE001
        _unavailable(f"PostgreSQL at {PG_URL}", exc)
    return PG_URL


@pytest.fixture(scope="session")
def amqp_url() -> str:
    try:
        _run_probe(_probe_amqp)
    except Exception as exc:  # noqa: BLE001
        _unavailable(f"RabbitMQ at {AMQP_URL}", exc)
    return AMQP_URL


@pytest.fixture
async def tendon(pg_url: str, amqp_url: str, s3_server) -> AsyncIterator[TendonEnv]:  # type: ignore[no-untyped-def]
    """A private Tendon world (schemas, queues, S3 bucket) torn down after the test."""
    world = TendonEnv(database_url=pg_url, amqp_url=amqp_url, extra=dict(s3_server.env))
    yield world
    await world.cleanup()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    yield procs
    procs.stop_all()
