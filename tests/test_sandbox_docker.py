"""The Docker sandbox backend under real Hands processes, against the engine (skipped with the
reason when none answers; TENDON_TEST_DOCKER=1 makes that a failure): a command outlives a
SIGKILLed worker and is re-attached through the operation log in the container's volume, never
started twice; a creation lost after the engine made the container is found, never duplicated;
a deletion waits for a running command, then removes the container and its volume."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from hands.sandbox.rules.binding import PRIVATE, identity
from tests.sandbox_support import (
    IMAGE,
    SandboxBus,
    backend,
    call,
    held,
    listed,
    output_of,
    remove_everything,
    sandbox_bus,
    serve_args,
    spec,
)
from tests.support import Processes, TendonEnv, run_cli, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]
SESSIONS = ("d1", "d2", "d3")


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Any]:
    b = backend("docker", tmp_path)  # skips (or fails) here when there is no engine
    yield b
    for session in SESSIONS:
        remove_everything(b, PRIVATE + session)


@pytest.fixture
async def bus(tendon: TendonEnv, box: Any) -> AsyncIterator[SandboxBus]:
    tendon.extra["TENDON_SANDBOX_IMAGE"] = IMAGE
    async with sandbox_bus(tendon) as b:
        yield b


async def lines(box: Any, session: str, path: str, count: int) -> None:
    ident = identity("tests", PRIVATE + session, 1)

    async def there() -> bool:
        found = await box.find(ident)
        data = await box.read_file(ident, path) if found is not None else None
        return data is not None and len(data.splitlines()) >= count

    await wait_for(there, timeout=30, what=f"{count} line(s) in {path} of {ident}")


async def test_a_command_in_a_container_outlives_a_killed_worker_and_is_never_started_twice(
    tendon: TendonEnv, processes: Processes, bus: SandboxBus, box: Any, tmp_path: Path
) -> None:
    args = serve_args(spec("docker", tmp_path))
    first = await processes.start_ready("hands", args, tendon.env)
    command = "echo started >> starts.txt; echo begin; sleep 4; echo end"
    eid = await bus.send(call("sandbox_exec", "d1", command=command))
    await lines(box, "d1", "starts.txt", 1)
    first.send_signal(signal.SIGKILL)
    await processes.wait_exit(first)
    await processes.start_ready("hands", args, tendon.env)
    done = await bus.wait_kind(eid, "succeeded")
    assert done.body.result["exit_code"] == 0 and output_of(bus.events(eid)) == "begin\nend\n"
    ident = identity("tests", PRIVATE + "d1", 1)
    assert await box.read_file(ident, "starts.txt") == b"started\n"


async def test_a_container_made_before_the_kill_is_found_and_used_never_made_twice(
    tendon: TendonEnv, processes: Processes, bus: SandboxBus, box: Any, tmp_path: Path
) -> None:
    args = serve_args(spec("docker", tmp_path))
    env = {**tendon.env, "TENDON_KILL_AT": "hands.sandbox_after_create"}
    first = await processes.start_ready("hands", args, env)
    eid = await bus.send(call("sandbox_exec", "d2", command="echo once >> starts.txt; echo hi"))
    assert await processes.wait_exit(first, timeout=60) == -signal.SIGKILL
    assert held(box, PRIVATE + "d2") == sorted(
        [identity("tests", PRIVATE + "d2", 1), "volume:" + identity("tests", PRIVATE + "d2", 1)]
    )
    await processes.start_ready("hands", args, tendon.env)
    done = await bus.wait_kind(eid, "succeeded")
    assert done.body.result["output"] == "hi\n"
    ident = identity("tests", PRIVATE + "d2", 1)
    assert held(box, PRIVATE + "d2") == sorted([ident, "volume:" + ident])  # still the one of each
    assert await box.read_file(ident, "starts.txt") == b"once\n"


async def test_a_deletion_waits_for_the_command_then_removes_the_container_and_its_volume(
    tendon: TendonEnv, processes: Processes, bus: SandboxBus, box: Any, tmp_path: Path
) -> None:
    sandbox = spec("docker", tmp_path)
    await processes.start_ready("hands", serve_args(sandbox), tendon.env)
    eid = await bus.send(call("sandbox_exec", "d3", command="echo go >> starts.txt; sleep 3; echo ok"))
    await lines(box, "d3", "starts.txt", 1)
    cli = ["-m", "hands", "sandbox", "request-deletion", "tests", PRIVATE + "d3", "--sandbox", sandbox]
    code, out, err = await run_cli(cli, tendon.env)
    assert code == 0 and "DELETING" in out, err
    assert held(box, PRIVATE + "d3")  # the command still runs in it
    assert (await bus.wait_kind(eid, "succeeded")).body.result["output"] == "ok\n"

    async def gone() -> bool:
        return held(box, PRIVATE + "d3") == []

    await wait_for(gone, timeout=30, what="the container and its volume to be removed")
    assert [r["status"] for r in await listed(tendon, sandbox)] == ["deleted"]
