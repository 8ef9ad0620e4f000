"""Deleting a sandbox with real Hands processes on the local backend: the deletion waits for a
running command and refuses new ones, then removes the workspace; a worker killed right after
the provider deleted it leaves a DELETING row that the next worker finishes."""

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
    sandbox_bus,
    serve_args,
    workspace,
)
from tests.support import Processes, TendonEnv, run_cli, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120), pytest.mark.usefixtures("leftovers")]


@pytest.fixture
async def bus(tendon: TendonEnv) -> AsyncIterator[SandboxBus]:
    async with sandbox_bus(tendon) as b:
        yield b


async def test_a_deletion_waits_for_a_running_command_then_removes_the_workspace(
    tendon: TendonEnv, processes: Processes, bus: SandboxBus, tmp_path: Path
) -> None:
    spec = f"local:{tmp_path / 'sandboxes'}"
    await processes.start_ready("hands", serve_args(spec), tendon.env)
    eid = await bus.send(call("sandbox_exec", "s3", command="echo go >> starts.txt; sleep 3; echo ok"))
    await lines_in(workspace(tmp_path, "s3") / "starts.txt", 1)
    # When its deletion is requested while the command runs
    code, out, err = await run_cli(
        ["-m", "hands", "sandbox", "request-deletion", "tests", PRIVATE + "s3", "--sandbox", spec], tendon.env
    )
    assert code == 0, err
    assert "DELETING" in out
    refused = await bus.send(call("sandbox_exec", "s3", command="echo never >> starts.txt"))
    failed = await bus.wait_kind(refused, "failed")
    assert "being deleted" in failed.body.error["message"]
    # Then the command finishes, and only then the workspace goes
    assert workspace(tmp_path, "s3").is_dir()
    assert (await bus.wait_kind(eid, "succeeded")).body.result["exit_code"] == 0

    async def gone() -> bool:
        return not workspace(tmp_path, "s3").exists()

    await wait_for(gone, timeout=20, what="the workspace to be deleted")
    assert [r["status"] for r in await listed(tendon, spec)] == ["deleted"]
    # Nothing to reconcile there: one line, exit code 2
    reconcile = ["-m", "hands", "sandbox", "reconcile-creation", "tests", PRIVATE + "s3", "--sandbox", spec]
    code, out, err = await run_cli([*reconcile, "--outcome", "absent", "--evidence", "looked"], tendon.env)
    assert (code, err.strip()) == (
        2,
        f"hands: CONFLICT: sandbox {PRIVATE}s3 is DELETED, not UNKNOWN: nothing to reconcile",
    )


async def test_a_worker_killed_after_the_provider_deleted_leaves_a_deletion_the_next_one_finishes(
    tendon: TendonEnv, processes: Processes, bus: SandboxBus, tmp_path: Path
) -> None:
    spec = f"local:{tmp_path / 'sandboxes'}"
    env = {**tendon.env, "TENDON_KILL_AT": "hands.sandbox_after_delete"}
    first = await processes.start_ready("hands", serve_args(spec), env)
    made = await bus.send(call("fs_upload", "s4", path="a.txt", content="a"))
    await bus.wait_kind(made, "succeeded")
    cli = ["-m", "hands", "sandbox", "request-deletion", "tests", PRIVATE + "s4", "--sandbox", spec]
    assert (await run_cli(cli, tendon.env))[0] == 0
    assert await processes.wait_exit(first) == -signal.SIGKILL
    assert not workspace(tmp_path, "s4").exists()
    assert [r["status"] for r in await listed(tendon, spec)] == ["deleting"]
    await processes.start_ready("hands", serve_args(spec), tendon.env)

    async def deleted() -> bool:
        return [r["status"] for r in await listed(tendon, spec)] == ["deleted"]

    await wait_for(deleted, timeout=30, what="the deletion to be finished")
