"""Health is a look at now, not a latch: a Brain's or a Hands worker's ready file (what a
container's health check reads) says ready only while the process serves with its database and
its broker. A restarted process (the same container after a SIGKILL) starts by removing the file
its dead predecessor left; an outage of either service removes the file until the service is
back; and the warnings its loops repeat meanwhile come once every few seconds, with a count.

Real processes on the local services, each reached through a proxy that can play a stopped
service (``chaos.proxy.TcpCutter.go_down``).
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from chaos.proxy import TcpCutter
from infra.process.logging import REPEAT_EVERY
from infra.process.ready import ReadyFile
from tests.support import Processes, TendonEnv, run_cli, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

COMMANDS = {
    "brain": ["-m", "brain", "serve"],
    "hands": ["-m", "hands", "serve", "--route", "email", "--tools", "examples.email_tools"],
}
OUTAGE = 12.0  # seconds each service stays away


def through(tendon: TendonEnv, pg: TcpCutter, amqp: TcpCutter) -> dict[str, str]:
    return {**tendon.env, "TENDON_DATABASE_URL": pg.url, "TENDON_AMQP_URL": amqp.url}


def read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


async def appears(path: Path, timeout: float = 60.0) -> str:
    async def written() -> str | None:
        return await asyncio.to_thread(read, path)

    found: str = await wait_for(written, timeout=timeout, what=f"{path.name} to be written")
    return found


async def disappears(path: Path, timeout: float = 30.0) -> None:
    async def removed() -> bool:
        return await asyncio.to_thread(read, path) is None

    await wait_for(removed, timeout=timeout, what=f"{path.name} to be removed")


def size(proc: subprocess.Popen[bytes]) -> int:
    return Path(proc.log_path).stat().st_size  # type: ignore[attr-defined]


def lines_since(proc: subprocess.Popen[bytes], offset: int) -> list[dict[str, Any]]:
    """The JSON lines a process logged after ``offset``."""
    with open(proc.log_path, "rb") as log:  # type: ignore[attr-defined]
        log.seek(offset)
        return [json.loads(line) for line in log if line.startswith(b"{")]


@pytest.mark.parametrize("kind", sorted(COMMANDS))
async def test_a_restarted_server_removes_its_dead_predecessors_ready_file_before_waiting_for_services(
    kind: str, tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    # Given the ready file a killed process left (a container keeps its files across a restart)
    ready = tmp_path / f"{kind}.ready"
    ready.write_text(f"{kind}-dead-1\n")
    async with TcpCutter(tendon.database_url) as pg, TcpCutter(tendon.amqp_url) as amqp:
        pg.go_down()  # and its database not there yet

        # When the restarted process starts
        proc = processes.start(
            kind, COMMANDS[kind], {**through(tendon, pg, amqp), "TENDON_READY_FILE": str(ready)}
        )

        # Then the file is gone while it waits, and comes back, with its own id, once it serves
        await disappears(ready)
        assert proc.poll() is None, processes.output(proc)
        pg.come_back()
        worker = await appears(ready)
        assert worker.startswith(f"{kind}-") and worker != f"{kind}-dead-1"


async def test_ready_only_while_the_database_and_the_broker_are_there_and_outage_warnings_are_counted(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    async with TcpCutter(tendon.database_url) as pg, TcpCutter(tendon.amqp_url) as amqp:
        env = through(tendon, pg, amqp)
        ready = {kind: tmp_path / f"{kind}.ready" for kind in COMMANDS}
        procs = {
            kind: processes.start(kind, COMMANDS[kind], {**env, "TENDON_READY_FILE": str(ready[kind])})
            for kind in COMMANDS
        }
        for kind in COMMANDS:
            await appears(ready[kind])

        for service in (pg, amqp):
            # When the service goes away
            logged = {kind: size(proc) for kind, proc in procs.items()}
            service.go_down()
            # Then neither process says it is ready while it is away
            for kind in COMMANDS:
                await disappears(ready[kind])
            await asyncio.sleep(OUTAGE)
            for kind in COMMANDS:
                assert read(ready[kind]) is None, f"{kind} said ready with a service away"

            # And a repeated warning came once every REPEAT_EVERY seconds at most
            for kind, proc in procs.items():
                lines = await asyncio.to_thread(lines_since, proc, logged[kind])
                said = [line for line in lines if line.get("level") != "info"]
                kinds = Counter((str(line.get("event"))[:40], line.get("loop")) for line in said)
                most = math.ceil(OUTAGE / REPEAT_EVERY) + 2  # the first, one per period, the edges
                assert all(n <= most for n in kinds.values()), f"{kind}: {kinds.most_common(5)}"

            # And once it is back, both are ready again, still the same processes
            service.come_back()
            for kind in COMMANDS:
                await appears(ready[kind])
                assert procs[kind].poll() is None, processes.output(procs[kind])


async def test_the_ready_file_comes_back_when_another_process_removed_it(tmp_path: Path) -> None:
    # Given a ready process whose file someone else removed (a command run in its container with
    # the same TENDON_READY_FILE, which removes it at its exit)
    path = tmp_path / "ready"
    async with ReadyFile(str(path), "brain-1", {"PostgreSQL": lambda: True}, interval=0.05):
        assert read(path) == "brain-1"
        path.unlink()
        # Then it says ready again at its next look
        assert await appears(path, timeout=5) == "brain-1"
    assert read(path) is None  # and nothing is left once it stops


async def test_a_demo_run_in_a_servers_container_leaves_the_servers_ready_file_alone(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    ready.write_text("brain-serving-1\n")
    env = {"TENDON_READY_FILE": str(ready), "TENDON_LOG_LEVEL": "ERROR"}
    code, out, err = await run_cli(
        ["-m", "brain", "demo", "--data-dir", str(tmp_path / "demo")], env, timeout=120
    )
    assert code == 0, out + err
    assert read(ready) == "brain-serving-1"


async def test_a_ready_file_that_cannot_be_written_is_said_and_tried_again_not_fatal(tmp_path: Path) -> None:
    # Given a ready file in a directory that is not there (yet)
    path = tmp_path / "later" / "ready"
    async with ReadyFile(str(path), "hands-1", {"RabbitMQ": lambda: True}, interval=0.05) as ready:
        assert ready.failing and read(path) is None  # the process goes on
        # When the directory comes
        path.parent.mkdir()
        # Then the file is written at a next look
        assert await appears(path, timeout=5) == "hands-1"
