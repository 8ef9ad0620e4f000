"""A langgraph-sdk client streaming a run from a Brain on PostgreSQL that is SIGKILLed mid-run: the
client reconnects by itself (to the stream's ``Location``, with ``Last-Event-ID``) once another
Brain serves on the same address, the run goes on there, and the client gets every part once:
what it read before the kill and after it is exactly the run's stream read whole afterwards."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from langgraph_sdk import get_client

from tests.support import Processes, TendonEnv, free_port, wait_for

pytestmark = pytest.mark.chaos

BRAIN = ["-m", "brain", "serve"]
HANDS = ["-m", "hands", "serve", "--route", "hello", "--tools", "examples.hello_tools"]
HI = {"messages": [{"role": "user", "content": "greet Ada"}]}


async def test_a_stream_cut_by_a_sigkilled_brain_resumes_on_another_with_nothing_lost_or_doubled(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    tendon.routes.add("hello")
    port = free_port()
    env = {**tendon.env, "TENDON_HTTP": f"127.0.0.1:{port}", "TENDON_DRAIN_SECONDS": "0"}
    first = await processes.start_ready("brain", BRAIN, env)
    await processes.start_ready("hands", HANDS, env)
    gate = tmp_path / "go"
    agent = {"tools": ["greet"], "model": {"kind": "scripted", "script": [
        {"tool_calls": [{"tool": "greet", "args": {"name": "Ada"}}]}, {"gate": str(gate), "content": "done"},
    ]}}  # fmt: skip
    lg = get_client(url=f"http://127.0.0.1:{port}/langgraph", api_key=None)
    assistant = (await lg.assistants.create(graph_id="greeter", context={"agent": agent}))["assistant_id"]
    thread = (await lg.threads.create())["thread_id"]

    # Given a client streaming a run, which has read up to the tool's result
    seen: list[tuple[str, Any]] = []
    stream = lg.runs.stream(thread, assistant, input=HI, stream_mode=["messages-tuple", "values", "updates"])
    async for part in stream:
        seen.append((part.event, part.data))
        if part.event == "messages" and part.data[0]["type"] == "tool":
            break
    # When its Brain is SIGKILLed while the run waits for its model, and another serves the address
    first.send_signal(signal.SIGKILL)
    await processes.wait_exit(first)
    await processes.start_ready("brain", BRAIN, env)
    gate.touch()
    async for part in stream:  # the client reconnects by itself, with the last id it saw
        seen.append((part.event, part.data))

    # Then the run ended on the other Brain, and the client saw its whole stream, each part once
    run_id = seen[0][1]["run_id"]
    assert (await lg.runs.get(thread, run_id))["status"] == "success"
    whole = [(p.event, p.data) async for p in lg.runs.join_stream(thread, run_id)]
    assert seen[1:] == whole[1:]
    said = [d[0]["type"] for e, d in whole if e == "messages"]
    assert said == ["ai", "tool", "ai"]


async def test_a_run_on_postgresql_stops_at_its_interrupt_and_a_resume_ends_it(
    tendon: TendonEnv, processes: Processes
) -> None:
    tendon.routes.add("hello")
    port = free_port()
    env = {**tendon.env, "TENDON_HTTP": f"127.0.0.1:{port}", "TENDON_DRAIN_SECONDS": "0"}
    await processes.start_ready("brain", BRAIN, env)
    await processes.start_ready("hands", HANDS, env)
    agent = {"tools": ["greet"], "approvals": ["greet"], "model": {"kind": "scripted", "script": [
        {"tool_calls": [{"tool": "greet", "args": {"name": "Ada"}}]}, {"content": "done"},
    ]}}  # fmt: skip
    lg = get_client(url=f"http://127.0.0.1:{port}/langgraph", api_key=None)
    assistant = (await lg.assistants.create(graph_id="guarded", context={"agent": agent}))["assistant_id"]
    thread = (await lg.threads.create(metadata={"user": "ada"}))["thread_id"]
    stopped = await lg.runs.wait(thread, assistant, input=HI)
    assert [i["id"] for i in stopped["__interrupt__"]] == ["call-1"]
    assert [t["status"] for t in await lg.threads.search(metadata={"user": "ada"})] == ["interrupted"]
    with pytest.raises(Exception, match="busy"):
        await lg.runs.create(thread, assistant, input=HI)
    done = await lg.runs.wait(thread, assistant, command={"resume": {"call-1": {"decision": "approve"}}})
    assert [m["type"] for m in done["messages"]] == ["human", "ai", "tool", "ai"]
    runs = await lg.runs.list(thread)
    assert [r["status"] for r in runs] == ["success", "success"]
    history = await lg.threads.get_history(thread)
    assert len(history) == 4 and history[0]["values"] == done

    async def cron_ran() -> bool:
        return len(await lg.runs.list(thread, limit=50)) > 2

    cron = await lg.crons.create_for_thread(thread, "guarded", schedule="* * * * * *", input=HI)
    await wait_for(cron_ran, timeout=20, what="the cron's first run")
    await lg.crons.update(cron["cron_id"], enabled=False)
    assert (await lg.crons.search(thread_id=thread))[0]["enabled"] is False
