"""The README's sandbox agent, end to end: a Brain, a sandbox pool on the local backend, and the
agent that writes a program into its sandbox and runs it; the pool is SIGKILLed while the program
runs, another one takes over, and the turn completes with the program's output, run once."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from hands.sandbox.rules.binding import PRIVATE, identity
from tests.sandbox_support import ROUTE, leftovers, lines_in, serve_args  # noqa: F401 - a fixture
from tests.support import Observer, Processes, TendonEnv, run_cli

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120), pytest.mark.usefixtures("leftovers")]


async def test_the_sandbox_agent_writes_runs_and_answers_through_a_hands_kill(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    tendon.routes = {ROUTE}
    sandboxes = tmp_path / "sandboxes"
    await processes.start_ready("brain", ["-m", "brain", "serve"], tendon.env)
    hands = await processes.start_ready("hands", serve_args(f"local:{sandboxes}"), tendon.env)
    submit = ["-m", "brain", "submit", "--session", "coder", "--request-id", "1", "--expect-tools"]
    code, out, err = await run_cli(
        [*submit, "--agent", "examples/sandbox_agent.json", "Say hello"], tendon.env
    )
    assert code == 0, err
    turn = out.strip()
    # The program runs in the sandbox: its worker dies
    workspace = sandboxes / identity("default", PRIVATE + "coder", 1)
    await lines_in(workspace / "runs.txt", 1)
    hands.send_signal(signal.SIGKILL)
    await processes.wait_exit(hands)
    await processes.start_ready("hands", serve_args(f"local:{sandboxes}"), tendon.env)
    code, shown, err = await run_cli(["-m", "brain", "wait", turn, "--timeout", "60"], tendon.env)
    assert code == 0, shown + err
    assert "hello from the sandbox" in shown
    assert (workspace / "runs.txt").read_text() == "ran\n"
    done = {e["tool"]: (e["status"], e["how"]) for e in await Observer(tendon).executions(turn)}
    assert done == {"fs_upload": ("succeeded", "ran"), "sandbox_exec": ("succeeded", "ran")}
