"""Double texting with a running Brain, a Hands pool and a chat-completions model (the local server
records what the provider was sent), on the embedded backend and on PostgreSQL with RabbitMQ: a new
message that interrupts a turn while two of its tools run stops both, closes both calls with their
outcomes, and the model is sent the work so far with no dangling call, then the new message; one
that rolls it back is sent the new message alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from brain import verbs
from brain.app import open_backends, run
from brain.rules.agents import AgentDefinition
from brain.store import BrainStore, wake_channel
from brain.verbs import controls
from brain.verbs.describe import describe
from hands.app import HandsApp
from infra.liveness import new_worker_id
from infra.process.killpoints import KillPoints
from infra.process.settings import Settings
from infra.transport import Topology
from local.embedded import DataDir, run_local
from tests.chat_server import ChatServer, Reply, tool_results
from tests.support import TendonEnv, wait_for
from tests.test_double_texting import dangling

TOOLS = "tests.brain_e2e_tools"


@dataclass
class System:
    store: BrainStore
    settings: Settings


@asynccontextmanager
async def embedded(settings: Settings, tmp_path: Path) -> AsyncIterator[System]:
    data = DataDir(tmp_path / "data")
    async with run_local(settings, data, pools=[("bulk", TOOLS)], killpoints=KillPoints()) as running:
        yield System(running.brain, settings)


@asynccontextmanager
async def distributed(settings: Settings) -> AsyncIterator[System]:
    """A Brain and a Hands pool of route bulk in this process, on PostgreSQL and RabbitMQ."""
    stop = asyncio.Event()
    async with open_backends(settings, new_worker_id("brain")) as backends:
        async with HandsApp(settings, route="bulk", tools=TOOLS) as hands:
            brain = asyncio.create_task(run(backends, settings, KillPoints(), stop))
            serving = asyncio.create_task(hands.serve())
            try:
                yield System(backends.store, settings)
            finally:
                stop.set()
                hands.stop()
                await brain
                await serving


@pytest.fixture(params=["sqlite", "postgres"])
async def system(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tendon: TendonEnv
) -> Any:
    monkeypatch.setenv("BULK_RUNS_FILE", str(tmp_path / "runs.txt"))
    monkeypatch.setenv("DOUBLE_TEXT_KEY", "test")
    options = {"scan_interval": 0.2, "reconnect_grace": 0.5, "lease_seconds": 10, "http": "off"}
    if request.param == "sqlite":
        async with embedded(Settings(**options), tmp_path) as running:
            yield running
        return
    tendon.routes.add("bulk")
    async with distributed(tendon.settings(**options)) as running:
        yield running


def policy(body: dict[str, Any]) -> Reply:
    """The first message asks for two long steps; any later one is answered."""
    users = [m["content"] for m in body["messages"] if m["role"] == "user"]
    if users[-1] == "first":
        steps = [("slow_step", f'{{"seconds": 60, "label": "{label}"}}') for label in "ab"]
        return Reply(tool_calls=steps, call_ids=["call_a", "call_b"])
    return Reply(content=f"answered {users[-1]}")


async def submit(system: System, agent: AgentDefinition, request: str, text: str, strategy: str) -> str:
    s = system.settings
    turn_id, _ = await verbs.submit(
        system.store, namespace=s.namespace, session_id="s", request_id=request, user_input=text, agent=agent,
        wake_channel=wake_channel(s), strategy=strategy, topology=Topology(s.queue_prefix),
    )  # fmt: skip
    return turn_id


async def reached(system: System, turn_id: str, check: Any, what: str) -> dict[str, Any]:
    async def look() -> Any:
        found = await describe(system.store, system.settings.namespace, turn_id)
        return found if check(found) else None

    return await wait_for(look, timeout=60, what=what)


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
async def test_a_new_message_stops_a_turn_whose_two_tools_run_and_the_provider_never_sees_a_dangling_call(
    system: System, strategy: str, tmp_path: Path
) -> None:
    with ChatServer(policy) as server:
        model = {"kind": "openai", "name": "m", "base_url": server.url, "api_key_env": "DOUBLE_TEXT_KEY",
                 "timeout": 10}  # fmt: skip
        agent = AgentDefinition.model_validate(
            {"name": "chat", "version": "1", "model": model, "tools": ["slow_step"]}
        )
        # Given a turn whose two tools run
        first = await submit(system, agent, "r1", "first", "enqueue")
        running = await reached(
            system, first, lambda d: [e["status"] for e in d["executions"]] == ["running", "running"],
            "both tools to run",
        )  # fmt: skip
        # When a new message comes with the strategy
        second = await submit(system, agent, "r2", "second", strategy)
        # Then the first turn ends cancelled, both tools stopped, and the new message is answered
        done = await reached(system, second, lambda d: d["status"] == "completed", "the new turn to complete")
        ended = await describe(system.store, system.settings.namespace, first)
        sent = server.requests[-1]["messages"]
    assert done["result"] == {"text": "answered second"} and ended["status"] == "cancelled"
    assert sorted(e["status"] for e in ended["executions"]) == ["cancelled", "cancelled"]
    runs = (tmp_path / "runs.txt").read_text().splitlines()
    assert sorted(line.split(" ")[1:3] == ["stopped", "by"] for line in runs) == [False, False, True, True]
    assert {e["id"] for e in running["executions"]} == {line.split()[-1] for line in runs}
    (receipt,) = await controls.receipts(system.store, namespace=system.settings.namespace, turn_id=first)
    how = "interrupted by a new message" if strategy == "interrupt" else "rolled back for a new message"
    assert (receipt.request_id, receipt.status, receipt.reason) == (
        f"{strategy}:{second}", "applied", f"{how} (turn {second})",
    )  # fmt: skip
    assert dangling(sent) == []
    if strategy == "interrupt":
        # the work so far, each call closed with its outcome, then the new message
        assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool", "user"]
        assert [m["content"] for m in sent if m["role"] == "user"] == ["first", "second"]
        why = {"code": "cancelled", "message": f"interrupted by a new message (turn {second})"}
        assert [(r["tool_call_id"], r["status"], r["error"]) for r in tool_results({"messages": sent})] == [
            ("call_a", "cancelled", why), ("call_b", "cancelled", why),
        ]  # fmt: skip
    else:
        assert sent == [{"role": "user", "content": "second"}]


def slow_policy(body: dict[str, Any]) -> Reply:
    """As ``policy``, but the first reply takes a second and a half to come."""
    reply = policy(body)
    return (
        Reply(tool_calls=reply.tool_calls, call_ids=reply.call_ids, delay=1.5) if reply.tool_calls else reply
    )


async def test_a_new_message_during_a_model_call_stops_the_turn_at_its_next_boundary_before_any_tool_runs(
    system: System, tmp_path: Path
) -> None:
    with ChatServer(slow_policy) as server:
        model = {"kind": "openai", "name": "m", "base_url": server.url, "api_key_env": "DOUBLE_TEXT_KEY",
                 "timeout": 10}  # fmt: skip
        agent = AgentDefinition.model_validate(
            {"name": "chat", "version": "1", "model": model, "tools": ["slow_step"]}
        )
        # Given a turn whose model call is in flight
        first = await submit(system, agent, "r1", "first", "enqueue")
        await wait_for(
            lambda: asyncio.sleep(0, len(server.requests) == 1 or None), timeout=30, what="the call"
        )
        # When a new message interrupts it
        second = await submit(system, agent, "r2", "second", "interrupt")
        # Then the reply in flight is kept (the work so far), its calls closed as cancelled without
        # running, and the new message is answered after them
        done = await reached(system, second, lambda d: d["status"] == "completed", "the new turn to complete")
        ended = await describe(system.store, system.settings.namespace, first)
        sent = server.requests[-1]["messages"]
    assert ended["status"] == "cancelled" and done["result"] == {"text": "answered second"}
    assert [e["status"] for e in ended["executions"]] == ["cancelled", "cancelled"]
    assert not (tmp_path / "runs.txt").exists()  # neither tool started
    assert dangling(sent) == []
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool", "user"]
