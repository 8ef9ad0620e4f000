"""Fixtures on real services: the local PostgreSQL and RabbitMQ (or TENDON_TEST_* URLs) and
an S3 API server (moto's server mode). Outside CI a missing service skips; under CI=true it
fails the run, because a skipped test is not a passing test.

Nothing a test creates on the shared services may outlive the session: leftover quorum queues
pile up run after run until the broker stops answering. So every world's prefix and schemas
are recorded when it is made (``tests.support.WORLDS``), its teardown deletes them even after
a failure, a test that timed out is stopped before its teardown runs, and the session ends
with a sweep that finishes any cleanup that was cut short. The sweep touches only names under
the prefixes and schemas this session recorded.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import subprocess
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import aio_pika
import asyncpg
import pytest

from tests.support import UNCLEANED, WORLDS, Processes, TendonEnv, delete_queues_and_exchanges

pytest_plugins = ["tests.s3server", "tests.hands_bus"]

PG_URL = os.environ.get("TENDON_TEST_DATABASE_URL", "postgresql://root@127.0.0.1:5432/test")
AMQP_URL = os.environ.get("TENDON_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")

# The suite starts a few hundred Brain, Hands and CLI processes. Where the environment forbids
# bytecode files, each of them compiled every Tendon module from source again (a tenth of its
# start-up); the children may write them, so only the first one compiles.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


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


# The Processes of the running test (at most one): stopped before its world is deleted.
_running: list[Processes] = []


@pytest.fixture
async def tendon(pg_url: str, amqp_url: str, s3_server) -> AsyncIterator[TendonEnv]:  # type: ignore[no-untyped-def]
    """A private Tendon world (schemas, queues, S3 bucket) torn down after the test."""
    world = TendonEnv(database_url=pg_url, amqp_url=amqp_url, extra=dict(s3_server.env))
    yield world
    # A live Brain or Hands re-declares a deleted queue: its processes go first, whatever
    # the order the fixtures were set up in (stopping twice is harmless). Off the loop, which
    # may carry a proxy the processes talk through.
    for procs in list(_running):
        await asyncio.to_thread(procs.stop_all)
    await world.cleanup()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    _running.append(procs)
    try:
        yield procs
    finally:
        _running.remove(procs)
        procs.stop_all()


# ---- a test that restarts a service that every test shares -------------------------------


# Under pytest-xdist (``-n``) the workers share the PostgreSQL and RabbitMQ of this machine. A
# test marked ``restarts_services`` holds the services lock exclusively, the others hold it shared
# (a file lock in the run's own temporary directory, which every worker's is under). The turnstile
# stops new shared holders while an exclusive one waits: without it, the other worker's tests
# could keep it waiting.
@pytest.fixture(autouse=True)
def _services_lock(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    if "PYTEST_XDIST_WORKER" not in os.environ:  # one process: nothing runs beside the test
        yield
        return
    exclusive = request.node.get_closest_marker("restarts_services") is not None
    run = tmp_path_factory.getbasetemp().parent
    with open(run / "services.turnstile", "a+b") as turnstile, open(run / "services.lock", "a+b") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# ---- a test that timed out ----------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    """Cancel an async test that did not finish, before its fixtures are torn down.

    pytest-timeout (signal method) raises in the middle of the event loop and leaves the test's
    task pending in it; the loop runs again for each async fixture's teardown, and the test
    would carry on there, declaring the queues its teardown just deleted.
    """
    try:
        return (yield)
    finally:
        _cancel_unfinished_test_task(item)


def _cancel_unfinished_test_task(item: pytest.Item) -> None:
    function = getattr(item, "obj", None)
    code = getattr(getattr(function, "__wrapped__", function), "__code__", None)
    if code is None:
        return
    for runner in getattr(item, "funcargs", {}).values():
        if not isinstance(runner, asyncio.Runner):
            continue
        loop = runner.get_loop()
        if loop.is_closed() or loop.is_running():
            continue
        stuck = [
            task
            for task in asyncio.all_tasks(loop)
            if getattr(task.get_coro(), "cr_code", None) is code and not task.done()
        ]
        for task in stuck:
            task.cancel()
        if stuck:
            runner.run(_settle(stuck))


async def _settle(tasks: list[asyncio.Task[Any]]) -> None:
    await asyncio.wait(tasks, timeout=10)


# ---- a run ended from outside ------------------------------------------------------------

_previous_sigterm: Any = None


def pytest_configure(config: pytest.Config) -> None:
    """Take SIGTERM (``timeout``, a CI job cancelled) as Ctrl-C: pytest then still tears the
    fixtures down and the session's sweep runs, where SIGTERM's default would kill the run
    with its worlds in place. Only when nobody installed a handler of their own."""
    global _previous_sigterm
    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            _previous_sigterm = signal.signal(signal.SIGTERM, _interrupt)


def pytest_unconfigure(config: pytest.Config) -> None:
    global _previous_sigterm
    if _previous_sigterm is not None:
        signal.signal(signal.SIGTERM, _previous_sigterm)
        _previous_sigterm = None


def _interrupt(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the run at once
    raise KeyboardInterrupt(f"signal {signum}")


# ---- the session's last sweep -------------------------------------------------------------

_swept: list[str] = []


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Delete what this session's worlds left behind, and say so in the summary."""
    if not WORLDS:
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        _swept.extend(pool.submit(asyncio.run, _sweep()).result())


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _swept:
        terminalreporter.section("leftovers deleted at the end of the session", yellow=True)
        for line in _swept:
            terminalreporter.write_line(line)


async def _sweep() -> list[str]:
    notes: list[str] = []
    # Worlds whose teardown did not finish: clean them up again, now that nothing runs.
    for world in list(UNCLEANED.values()):
        try:
            await world.cleanup()
            notes.append(f"world {world.prefix}: its teardown had not finished; cleaned up now")
        except Exception as exc:  # noqa: BLE001 - report it and go on
            notes.append(f"world {world.prefix}: cleanup failed again: {exc!r}")
    by_amqp: dict[str, list[TendonEnv]] = {}
    by_pg: dict[str, list[TendonEnv]] = {}
    for world in WORLDS.values():
        by_amqp.setdefault(world.amqp_url, []).append(world)
        by_pg.setdefault(world.database_url, []).append(world)
    # Anything else under a recorded prefix (a queue of a route no world listed), where the
    # broker can be listed. Only names under this session's prefixes are touched.
    for url, worlds in by_amqp.items():
        listed = await asyncio.to_thread(_list_broker, url)
        if listed is None:
            continue
        queues, exchanges = listed
        prefixes = tuple(f"{w.prefix}." for w in worlds)
        left_queues = sorted(n for n in queues if n.startswith(prefixes))
        left_exchanges = sorted(n for n in exchanges if n.startswith(prefixes))
        if left_queues or left_exchanges:
            try:
                await delete_queues_and_exchanges(url, left_queues, left_exchanges)
                notes.append(f"deleted {', '.join(left_queues + left_exchanges)}")
            except Exception as exc:  # noqa: BLE001
                notes.append(f"could not delete {', '.join(left_queues + left_exchanges)}: {exc!r}")
    for url, worlds in by_pg.items():
        names = [schema for w in worlds for schema in w.schemas]
        try:
            conn = await asyncpg.connect(url, timeout=10)
        except Exception as exc:  # noqa: BLE001
            notes.append(f"could not check the schemas at {url}: {exc!r}")
            continue
        try:
            rows = await conn.fetch("SELECT nspname FROM pg_namespace WHERE nspname = ANY($1::text[])", names)
            for row in rows:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{row["nspname"]}" CASCADE')
                notes.append(f"dropped schema {row['nspname']}")
        except Exception as exc:  # noqa: BLE001
            notes.append(f"could not drop the schemas left at {url}: {exc!r}")
        finally:
            await conn.close()
    return notes


def _list_broker(amqp_url: str) -> tuple[list[str], list[str]] | None:
    """The broker's queue and exchange names, by ``rabbitmqctl`` when the broker is this host's;
    None when it cannot be listed (another host, no rabbitmqctl, no answer in time)."""
    parts = urlsplit(amqp_url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        return None
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    listed = []
    for what in ("list_queues", "list_exchanges"):
        try:
            done = subprocess.run(
                ["timeout", "20", "rabbitmqctl", what, "-p", vhost, "-q", "--no-table-headers", "name"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode != 0:
            return None
        listed.append([line.strip() for line in done.stdout.splitlines() if line.strip()])
    return listed[0], listed[1]
