"""The local sandbox backend under real Hands processes, SIGKILLed: a command outlives its worker
and is re-attached through its operation log, never started twice; a creation whose reply was
lost (a kill point right after the provider made it) is found and finished, never duplicated."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hands.sandbox.rules.binding import PRIVATE
from tests.sandbox_support import (  # noqa: F401 - leftovers: a fixture
    SandboxBus,
    call,
    leftovers,
    lines_in,
    listed,
    output_of,
    sandbox_bus,
    serve_args,
    workspace,
)
from tests.support import Processes, TendonEnv

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120), pytest.mark.usefixtures("leftovers")]


@pytest.fixture
async def bus(tendon: TendonEnv) -> AsyncIterator[SandboxBus]:
    async with sandbox_bus(tendon) as b:
        yield b


async def test_a_command_outlives_a_killed_worker_and_is_reattached_never_started_twice(
    tendon: TendonEnv, processes: Processes, bus: SandboxBus, tmp_path: Path
) -> None:
    spec = f"local:{tmp_path / 'sandboxes'}"
    first = await processes.start_ready("hands", serve_args(spec), tendon.env)
    command = "echo started >> starts.txt; echo begin; sleep 10; echo end; exit 3"
    cmd = call("sandbox_exec", "s1", command=command)
    eid = await bus.send(cmd)
    # Given the command running in the sandbox, its worker is SIGKILLed
    await lines_in(workspace(tmp_path, "s1") / "starts.txt", 1)
    first.send_signal(signal.SIGKILL)
    await processes.wait_exit(first)
    # When another worker takes the execution over
    await processes.start_ready("hands", serve_args(spec), tendon.env)
    done = await bus.wait_kind(eid, "succeeded")
    # Then it followed the same command to its end, through the operation log
    assert done.body.result["exit_code"] == 3 and not done.body.result["timed_out"]
    assert "begin" in done.body.result["output"] and "end" in done.body.result["output"]
    assert (workspace(tmp_path, "s1") / "starts.txt").read_text().splitlines() == ["started"]
    await bus.complete(cmd)  # a page the dead worker committed but never published: replayed
    assert output_of(bus.events(eid)) == "begin\nend\n"
    # One start (its events are sent again by the new worker: the same seqs), no other outcome
    kinds = [e.kind for _, e in sorted(bus.by_seq(eid).items())]
    assert kinds[:2] == ["accepted", "started"] and kinds[-1] == "succeeded"
    assert set(kinds[2:-1]) == {"output_page"}


async def test_a_creation_whose_reply_was_lost_is_found_after_the_kill_never_made_twice(
    tendon: TendonEnv, processes: Processes, bus: SandboxBus, tmp_path: Path
) -> None:
    spec = f"local:{tmp_path / 'sandboxes'}"
    env = {**tendon.env, "TENDON_KILL_AT": "hands.sandbox_after_create"}
    first = await processes.start_ready("hands", serve_args(spec), env)
    eid = await bus.send(call("sandbox_exec", "s2", command="echo once >> starts.txt; echo hi"))
    # Given a worker that died right after the provider made the sandbox
    assert await processes.wait_exit(first) == -signal.SIGKILL
    made = workspace(tmp_path, "s2")
    assert made.is_dir() and not (made / ".tendon/marker.json").exists()
    # When another worker recovers the execution
    await processes.start_ready("hands", serve_args(spec), tendon.env)
    done = await bus.wait_kind(eid, "succeeded")
    # Then the sandbox made then is the one used: finished, the only one, the command run once
    assert done.body.result["exit_code"] == 0 and output_of(bus.events(eid)) == "hi\n"
    assert sorted(p.name for p in (tmp_path / "sandboxes").iterdir()) == [made.name]
    assert (made / ".tendon/marker.json").exists()
    assert (made / "starts.txt").read_text() == "once\n"
    rows = await listed(tendon, spec)
    assert [(r["binding_id"], r["status"]) for r in rows] == [(PRIVATE + "s2", "ready")]
