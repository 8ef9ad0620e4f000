"""A sandbox pool of real Hands processes on the local backend: sessions share a named binding,
a cancel and a timeout stop a command in the sandbox, a command whose wrapper was lost is UNKNOWN
unless marked idempotent (then it runs again), and an artifact goes to the object store."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hands.sandbox.backends.local import LocalBackend
from hands.sandbox.rules.binding import identity
from infra.objects.s3 import S3ObjectStore
from protocol import ObjectRef
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
from tests.support import Processes, TendonEnv, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120), pytest.mark.usefixtures("leftovers")]


@pytest.fixture
async def bus(tendon: TendonEnv) -> AsyncIterator[SandboxBus]:
    async with sandbox_bus(tendon) as b:
        yield b


async def test_two_sessions_sharing_a_named_sandbox_see_the_same_workspace(
    tendon: TendonEnv, processes: Processes, bus: SandboxBus, tmp_path: Path
) -> None:
    spec = f"local:{tmp_path / 'sandboxes'}"
    await processes.start_ready("hands", serve_args(spec), tendon.env)
    up = await bus.send(call("fs_upload", "alice", path="notes/plan.txt", content="step 1", sandbox="team"))
    assert (await bus.wait_kind(up, "succeeded")).body.result["bytes"] == 6
    read = await bus.send(call("sandbox_exec", "bob", command="cat notes/plan.txt", sandbox="team"))
    assert (await bus.wait_kind(read, "succeeded")).body.result["output"] == "step 1"
    down = await bus.send(call("fs_download", "bob", path="notes/plan.txt"))  # bob's own: not there
    assert "not a file" in (await bus.wait_kind(down, "failed")).body.error["message"]
    boxes = LocalBackend(tmp_path / "sandboxes")
    assert await boxes.find(identity("tests", "team", 1)) is not None


async def test_a_cancel_and_a_timeout_stop_the_command_in_the_sandbox(
    tendon: TendonEnv, processes: Processes, bus: SandboxBus, tmp_path: Path
) -> None:
    spec = f"local:{tmp_path / 'sandboxes'}"
    await processes.start_ready("hands", serve_args(spec), tendon.env)
    slow = call("sandbox_exec", "s5", command="echo up >> starts.txt; sleep 60")
    await bus.send(slow)
    timed = await bus.send(call("sandbox_exec", "s6", command="sleep 60", timeout_seconds=1))
    await lines_in(workspace(tmp_path, "s5") / "starts.txt", 1)
    await bus.cancel(slow)
    cancelled = await bus.wait_kind(slow.execution_id, "cancelled")
    assert "cancel" in cancelled.body.reason
    assert (await bus.wait_kind(timed, "succeeded")).body.result == {
        "exit_code": 124, "timed_out": True, "output_bytes": 0, "output": "",
    }  # fmt: skip
    exit_file = workspace(tmp_path, "s5") / f".tendon/ops/{slow.execution_id}/exit"
    assert exit_file.read_text().strip() == "143"  # TERM reached the command in the sandbox


def _kill_wrapper(tmp_path: Path, session: str, execution_id: str) -> None:
    """What a stopped sandbox does to a command: its wrapper and the command die, no exit code."""
    pid = int((workspace(tmp_path, session) / f".tendon/ops/{execution_id}/pid").read_text())
    os.killpg(pid, signal.SIGKILL)


@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_command_lost_without_an_exit_code_is_unknown_unless_marked_idempotent(
    tendon: TendonEnv, processes: Processes, bus: SandboxBus, tmp_path: Path, idempotent: bool
) -> None:
    spec = f"local:{tmp_path / 'sandboxes'}"
    await processes.start_ready("hands", serve_args(spec), tendon.env)
    # The second run (if any) ends at once; the first waits to be lost
    command = "echo run >> starts.txt; [ $(wc -l < starts.txt) -ge 2 ] || sleep 60; echo finished"
    cmd = call("sandbox_exec", "s7", command=command, idempotent=idempotent)
    await bus.send(cmd)
    await lines_in(workspace(tmp_path, "s7") / "starts.txt", 1)

    async def wrapper_up() -> bool:
        return (workspace(tmp_path, "s7") / f".tendon/ops/{cmd.execution_id}/pid").exists()

    await wait_for(wrapper_up, timeout=10, what="the wrapper's pid")
    _kill_wrapper(tmp_path, "s7", cmd.execution_id)
    if idempotent:
        done = await bus.wait_kind(cmd.execution_id, "succeeded")
        assert done.body.result["exit_code"] == 0 and done.body.result["output"] == "finished\n"
        assert (workspace(tmp_path, "s7") / "starts.txt").read_text() == "run\nrun\n"
    else:
        unknown = await bus.wait_kind(cmd.execution_id, "unknown")
        assert "wrapper is gone without an exit code" in unknown.body.reason
        assert (workspace(tmp_path, "s7") / "starts.txt").read_text() == "run\n"


async def test_an_artifact_is_published_to_the_object_store_and_verified(
    tendon: TendonEnv, processes: Processes, bus: SandboxBus, tmp_path: Path, s3_server: object
) -> None:
    spec = f"local:{tmp_path / 'sandboxes'}"
    await processes.start_ready("hands", serve_args(spec), tendon.env)
    made = await bus.send(call("sandbox_exec", "s8", command="mkdir -p out && seq 1 50000 > out/n.txt"))
    assert (await bus.wait_kind(made, "succeeded")).body.result["exit_code"] == 0
    cmd = call("artifact_publish", "s8", path="out/n.txt")
    await bus.send(cmd)
    ref = ObjectRef.model_validate(
        {
            k: v
            for k, v in (await bus.wait_kind(cmd.execution_id, "succeeded")).body.result.items()
            if k != "path"
        }
    )
    expected = (workspace(tmp_path, "s8") / "out/n.txt").read_bytes()
    async with S3ObjectStore(
        bucket=tendon.settings().s3_bucket, endpoint_url=tendon.settings().s3_endpoint_url
    ) as store:
        got = await store.get(ref, expected_scope="tests/s8", expected_binding=f"{cmd.execution_id}/artifact")
    assert got == expected and ref.size == len(expected)


async def test_a_command_that_ended_while_no_worker_lived_is_read_back_from_its_log(
    tendon: TendonEnv, processes: Processes, bus: SandboxBus, tmp_path: Path
) -> None:
    spec = f"local:{tmp_path / 'sandboxes'}"
    first = await processes.start_ready("hands", serve_args(spec), tendon.env)
    cmd = call("sandbox_exec", "s9", command="echo a >> starts.txt; echo a; sleep 1; echo b; exit 7")
    await bus.send(cmd)
    await lines_in(workspace(tmp_path, "s9") / "starts.txt", 1)
    first.send_signal(signal.SIGKILL)
    await processes.wait_exit(first)
    exit_file = workspace(tmp_path, "s9") / f".tendon/ops/{cmd.execution_id}/exit"

    async def ended() -> bool:
        return exit_file.exists()

    await wait_for(ended, timeout=10, what="the command to end with no worker")
    await processes.start_ready("hands", serve_args(spec), tendon.env)
    done = await bus.wait_kind(cmd.execution_id, "succeeded")
    assert (done.body.result["exit_code"], done.body.result["output"]) == (7, "a\nb\n")
    assert (workspace(tmp_path, "s9") / "starts.txt").read_text() == "a\n"


async def test_output_is_paged_whole_and_in_order_even_where_a_page_splits_a_character(
    tendon: TendonEnv, processes: Processes, bus: SandboxBus, tmp_path: Path
) -> None:
    spec = f"local:{tmp_path / 'sandboxes'}"
    await processes.start_ready("hands", serve_args(spec), tendon.env)
    # 100,002 bytes: past one page (64 KiB), whose end falls inside a two-byte character
    command = "printf a; python3 -c \"print('\\u00e9' * 50000)\""
    cmd = call("sandbox_exec", "s10", command=command)
    await bus.send(cmd)
    done = await bus.wait_kind(cmd.execution_id, "succeeded")
    expected = "a" + "\u00e9" * 50000 + "\n"
    assert done.body.result["output_bytes"] == len(expected.encode()) == 100002
    assert output_of(bus.events(cmd.execution_id)) == expected
    assert len([e for e in bus.by_seq(cmd.execution_id).values() if e.kind == "output_page"]) >= 2
