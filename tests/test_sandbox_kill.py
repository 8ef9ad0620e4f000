"""The local sandbox backend under real Hands processes, SIGKILLed: a command outlives its worker
and is re-attached through its operation log, never started twice; a creation whose reply was
lost (a kill point right after the provider made it) is found and finished, never duplicated; a
deletion waits for a running command; sessions share a named binding."""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hands.sandbox.backends.local import LocalBackend
from hands.sandbox.rules.binding import PRIVATE, identity
from infra.transport.broker import Broker, Topology
from protocol import encode, new_id
from tests.hands_bus import Bus
from tests.sandbox_support import ROUTE, call, output_of, serve_args
from tests.support import Processes, TendonEnv, run_cli, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]


class SandboxBus(Bus):
    async def send(self, command: Any) -> str:
        await self.broker.publish(self.topology.commands(ROUTE), encode(command), message_id=new_id())
        return str(command.execution_id)


@pytest.fixture
async def bus(tendon: TendonEnv) -> AsyncIterator[SandboxBus]:
    tendon.routes = {ROUTE}
    settings = tendon.settings()
    async with Broker(settings.amqp_url, Topology(settings.queue_prefix)) as broker:
        b = SandboxBus(tendon, broker)
        await broker.consume(broker.topology.updates, b._on_update, prefetch=100)
        yield b


def workspace(tmp_path: Path, session: str) -> Path:
    return tmp_path / "sandboxes" / identity("tests", PRIVATE + session, 1)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


async def lines_in(path: Path, count: int) -> None:
    async def there() -> bool:
        return _lines(path) >= count

    await wait_for(there, timeout=20, what=f"{count} line(s) in {path}")


async def test_a_command_outlives_a_killed_worker_and_is_reattached_never_started_twice(
    tendon: TendonEnv, processes: Processes, bus: SandboxBus, tmp_path: Path
) -> None:
    spec = f"local:{tmp_path / 'sandboxes'}"
    first = await processes.start_ready("hands", serve_args(spec), tendon.env)
    command = "echo started >> starts.txt; echo begin; sleep 10; echo end; exit 3"
    eid = await bus.send(call("sandbox_exec", "s1", command=command))
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
    listed = await _list(tendon, spec)
    assert [(r["binding_id"], r["status"]) for r in listed] == [(PRIVATE + "s2", "ready")]


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
    assert [r["status"] for r in await _list(tendon, spec)] == ["deleted"]


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


async def _list(tendon: TendonEnv, spec: str) -> list[dict[str, Any]]:
    args = ["-m", "hands", "sandbox", "list", "--json", "--sandbox", spec]
    code, out, err = await run_cli(args, tendon.env)
    assert code == 0, err
    return list(json.loads(out))
