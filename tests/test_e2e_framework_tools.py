"""Framework tools on a Hands pool, with a Brain and Hands as real OS processes on real services.

The tools are Pydantic AI and OpenAI Agents SDK tools (``tests/framework_pydantic_agents.py``,
``tests/framework_sdk_agents.py``, and the five-email examples); the Brain runs a scripted JSON
agent that calls them by name, as it calls any binding. Kill points (TENDON_KILL_AT) SIGKILL the
Hands right after a tool body returned, before its outcome is committed: what recovery does then is
the tool's replay policy.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from examples.mailbox import MailboxServer
from hands.tools.registry import load_tools
from tests.support import Observer, Processes, TendonEnv, run_cli, wait_for

pytestmark = pytest.mark.chaos

# By default each framework has one run here (Pydantic AI: the safe and the unsafe kill; the Agents
# SDK: the five emails and their query), about 20 s; TENDON_TEST_FRAMEWORK_MATRIX=1 runs both
# frameworks through every case (each pool start imports a framework: 2 to 4 s).
MATRIX = os.environ.get("TENDON_TEST_FRAMEWORK_MATRIX") == "1"


def mirrored(value: Any, label: str) -> Any:
    """A parameter run only in the full matrix."""
    why = "the other framework's run of this case: TENDON_TEST_FRAMEWORK_MATRIX=1 runs it"
    return pytest.param(value, id=label, marks=() if MATRIX else pytest.mark.skip(reason=why))


BRAIN = ["-m", "brain", "serve"]


def quick(tendon: TendonEnv, **more: str) -> dict[str, str]:
    """The world's environment with a short lease: a killed worker's work is taken over sooner."""
    tendon.routes.add("fw")  # its queues are deleted with the test's
    return {**tendon.env, "TENDON_LEASE_SECONDS": "3", **more}


def hands(module: str, route: str) -> list[str]:
    return ["-m", "hands", "serve", "--route", route, "--tools", module]


def agent(tmp_path: Path, calls: list[tuple[str, dict[str, Any]]]) -> Path:
    """A scripted agent that makes ``calls`` one reply at a time (call-1, call-2...)."""
    script: list[dict[str, Any]] = [{"tool_calls": [{"tool": t, "args": a}]} for t, a in calls]
    definition = {
        "name": "fw-user",
        "version": "1",
        "instructions": "Use the tools.",
        "model": {"kind": "scripted", "script": [*script, {"content": "Done:\n{results}"}]},
        "tools": sorted({t for t, _ in calls}),
        "limits": {"max_model_calls": 5},
    }
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(definition))
    return path


async def submit(env: dict[str, str], agent_file: Path | str, text: str = "Go") -> str:
    """Submit a turn; its tools may be announced later (the pool starts after it)."""
    args = ["-m", "brain", "submit", "--session", "s-fw", "--request-id", "r1", "--agent", str(agent_file)]
    code, out, err = await run_cli([*args, "--expect-tools", text], env)
    assert code == 0, err
    return out.strip()


def runs(log: Path, tool: str) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in log.read_text().splitlines() if x] if log.exists() else []
    return [r for r in lines if r["tool"] == tool]


@pytest.mark.parametrize("sdk", [pytest.param(False, id="pydantic-ai"), mirrored(True, "openai-agents")])
async def test_a_killed_framework_tool_runs_again_if_safe_and_becomes_unknown_if_unsafe(
    tendon: TendonEnv, processes: Processes, tmp_path: Path, sdk: bool
) -> None:
    # Given a turn that calls a safe tool, then an unsafe one, and pools that die right after
    # the body of the first call (then of the second) returned, before its outcome was committed
    safe, unsafe = ("sdk_lookup", "sdk_effect") if sdk else ("lookup", "effect")
    log = tmp_path / "runs.jsonl"
    env = quick(tendon, FW_TEST_LOG=str(log))
    module = f"tests.framework_{'sdk' if sdk else 'pydantic'}_agents"  # a pool imports one framework
    pool = hands(module, "fw")
    await processes.start_ready("brain", BRAIN, env)
    calls = [(safe, {"key": "k2"}), (unsafe, {"key": "k1"})]
    turn_id = await submit(env, agent(tmp_path, calls))
    for kill in ("hands.after_tool_body@call-1", "hands.after_tool_body@call-2"):
        # not start_ready: the turn waits for it, so it may die before it was seen ready
        doomed = processes.start("hands", pool, {**env, "TENDON_KILL_AT": kill})
        assert await processes.wait_exit(doomed, timeout=60) == -signal.SIGKILL
    await processes.start_ready("hands", pool, env)

    # Then the unsafe one is UNKNOWN and the turn waits for a reconcile: its body ran once
    obs = Observer(tendon)

    async def unknown() -> Any:
        rows = await obs.executions(turn_id)
        return rows if len(rows) == 2 and rows[1]["status"] == "unknown" else None

    first, second = await wait_for(unknown, timeout=30, what="the unsafe execution to be UNKNOWN")
    assert f"unsafe tool {unsafe}, which has no query" in second["error"]["message"]
    turn = await obs.turn(turn_id)
    assert turn["status"] == "waiting" and "reconcile" in turn["waiting_for"]
    (ran,) = runs(log, unsafe)
    assert ran["op"] == second["id"], "the operation id the body saw is the execution id"
    # and the safe one ran again under the same operation id, its result what the framework would
    # give the model: Pydantic AI's JSON of the returned model, the Agents SDK's str() of it.
    assert [r["op"] for r in runs(log, safe)] == [first["id"], first["id"]]
    expected = "key='k2' value='K2'" if sdk else {"key": "k2", "value": "K2"}
    assert first["status"] == "succeeded" and first["result"] == expected
    # The pools announced their route's tools, as the framework defines them, and nothing else.
    rows = await obs.fetch("SELECT route, binding FROM {brain}.bindings")
    announced = {r["binding"]["name"]: r["binding"] for r in rows}
    assert {r["route"] for r in rows} == {"fw"}
    assert sorted(announced) == load_tools(module, "fw").names
    assert announced[safe]["input_schema"] == load_tools(module, "fw").get(safe).binding.input_schema


@pytest.fixture
def mailbox() -> Iterator[MailboxServer]:
    with MailboxServer(port=0) as server:
        yield server


@pytest.mark.parametrize(
    "module",
    [
        mirrored("examples.framework_tools_pydantic_ai", "pydantic-ai"),
        pytest.param("examples.framework_tools_openai_agents", id="openai-agents"),
    ],
)
async def test_the_fourth_email_of_a_framework_send_email_killed_mid_run_is_verified_by_its_query(
    tendon: TendonEnv, processes: Processes, mailbox: MailboxServer, module: str
) -> None:
    # Given a pool serving the example's send_email (unsafe, with a query) that dies right after
    # the mailbox accepted the 4th email
    env = quick(tendon, TENDON_MAILBOX_URL=mailbox.url)
    await processes.start_ready("brain", BRAIN, env)
    doomed = await processes.start_ready(
        "hands", hands(module, "email"), {**env, "TENDON_KILL_AT": "hands.after_tool_body@call-4"}
    )
    turn_id = await submit(env, "examples/notice_agent.json", "Send the notice")
    assert await processes.wait_exit(doomed) == -signal.SIGKILL

    # When another worker serves the route
    await processes.start_ready("hands", hands(module, "email"), env)

    # Then the 4th email is verified by its operation id, and every customer got exactly one
    obs = Observer(tendon)
    await obs.wait_turn(turn_id, "completed")
    rows = await obs.executions(turn_id)
    assert [r["how"] for r in rows] == ["ran", "ran", "ran", "verified_by_query", "ran"]
    stats = mailbox.stats()
    assert len(stats["deliveries"]) == 5 and sorted(stats["posts_per_key"].values()) == [1] * 5
    assert sorted(stats["posts_per_key"]) == sorted(r["id"] for r in rows), "keyed by the operation ids"
