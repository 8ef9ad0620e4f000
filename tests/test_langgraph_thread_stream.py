"""A LangGraph thread's stream, driven by the unmodified ``langgraph-sdk`` client
(``threads.join_stream``): it sends the whole of the run in progress when it opens and every run
made after, each run's parts under its id, its lifecycle (running, interrupted, success), the
thread's values; a join from an event id gets exactly the rest, once. On the embedded backend in
this process, with a Hands pool of ``examples.hello_tools``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient

from local.testing import LocalTendon, local_tendon

HI = {"messages": [{"role": "user", "content": "greet Ada"}]}
GREET = {"tool_calls": [{"tool": "greet", "args": {"name": "Ada"}}]}
GUARDED = {"tools": ["greet"], "approvals": ["greet"],
           "model": {"kind": "scripted", "script": [GREET, {"content": "I greeted Ada."}]}}  # fmt: skip
Part = tuple[str, str | None, Any]


@pytest.fixture
async def tendon(tmp_path: Path) -> AsyncIterator[LocalTendon]:
    async with local_tendon(tmp_path, "examples.hello_tools") as running:
        yield running


def client(tendon: LocalTendon) -> LangGraphClient:
    return get_client(url=f"{tendon.url}/langgraph")


async def read(stream: AsyncIterator[Any], until: Any, limit: float = 30) -> list[Part]:
    """Parts of ``stream`` up to the first for which ``until(parts so far)`` holds; then close it
    (a thread's stream never ends by itself)."""
    seen: list[Part] = []

    async def go() -> None:
        async for p in stream:
            seen.append((p.event, p.id, p.data))
            if until(seen):
                return

    try:
        await asyncio.wait_for(go(), limit)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    return seen


def lifecycle(seen: list[Part]) -> list[tuple[str, str]]:
    return [(d["run_id"], d["status"]) for e, _, d in seen if e == "metadata" and "status" in d]


async def test_a_thread_stream_sends_the_run_in_progress_and_every_later_run_and_resumes_from_an_id(
    tendon: LocalTendon, tmp_path: Path
) -> None:
    lg = client(tendon)
    gate = tmp_path / "go"
    slow = {"tools": ["greet"], "model": {"kind": "scripted",
            "script": [GREET, {"gate": str(gate), "content": "I greeted Ada."}]}}  # fmt: skip
    assistant = (await lg.assistants.create(graph_id="greeter", context={"agent": slow}))["assistant_id"]
    thread = (await lg.threads.create())["thread_id"]
    # Given a run in progress (its model waits on a gate)
    first = await lg.runs.create(thread, assistant, input=HI)

    # When a client joins the thread's stream, and the run ends, and a second run goes on the thread
    async def later() -> str:
        await asyncio.sleep(0.5)
        gate.touch()
        await lg.runs.join(thread, first["run_id"])
        second = await lg.runs.create(thread, assistant, input=HI, multitask_strategy="enqueue")
        return str(second["run_id"])

    second_run = asyncio.ensure_future(later())
    seen = await read(
        await lg.threads.join_stream(thread, stream_mode=["run_modes", "lifecycle"]),
        lambda s: [st for _, st in lifecycle(s)].count("success") == 2,
    )
    second = await second_run

    # Then it sent the whole of both runs, each under its own id, in order, each part once
    assert lifecycle(seen) == [
        (first["run_id"], "running"), (first["run_id"], "success"), (second, "running"), (second, "success")
    ]  # fmt: skip
    starts = [d["run_id"] for e, _, d in seen if e == "metadata" and "attempt" in d]
    assert starts == [first["run_id"], second]
    messages = [(d[1]["run_id"], d[0]["type"]) for e, _, d in seen if e == "messages"]
    assert messages == [(r, t) for r in (first["run_id"], second) for t in ("ai", "tool", "ai")]
    ids = [i for _, i, _ in seen]
    assert len(set(ids)) == len(ids) and all(i is not None for i in ids)
    assert [tuple(map(int, str(i).split("-"))) for i in ids] == sorted(
        tuple(map(int, str(i).split("-"))) for i in ids
    )
    final = (await lg.threads.get_state(thread))["values"]
    assert [d for e, _, d in seen if e == "values"][-1] == final
    assert seen[-1][0] == "metadata"  # the second run's end is the last part

    # And a join from an event id in the middle gets exactly the rest, once
    middle = len(seen) // 2
    rest = await read(
        await lg.threads.join_stream(
            thread, last_event_id=seen[middle][1], stream_mode=["run_modes", "lifecycle"]
        ),
        lambda s: len(s) >= len(seen) - middle - 1,
    )
    assert rest == seen[middle + 1 :]

    # And state_update from the start sends the thread's values as they grew, ending with its state
    grown = await read(
        await lg.threads.join_stream(thread, last_event_id="0", stream_mode="state_update"),
        lambda s: s[-1][2] == final,
    )
    assert {e for e, _, _ in grown} == {"values"}
    assert [len(d["messages"]) for _, _, d in grown] == sorted(len(d["messages"]) for _, _, d in grown)


async def test_a_thread_stream_says_an_interrupt_and_the_resumed_runs_end(tendon: LocalTendon) -> None:
    lg = client(tendon)
    assistant = (await lg.assistants.create(graph_id="guarded", context={"agent": GUARDED}))["assistant_id"]
    thread = (await lg.threads.create())["thread_id"]
    run = await lg.runs.create(thread, assistant, input=HI)
    # A client that joins the lifecycle from the start sees the run start and stop at its interrupt
    seen = await read(
        await lg.threads.join_stream(thread, last_event_id="0", stream_mode="lifecycle"),
        lambda s: len(s) == 2,
    )
    assert lifecycle(seen) == [(run["run_id"], "running"), (run["run_id"], "interrupted")]
    # and, from there, the turn's end once a resume answered it
    await lg.runs.wait(thread, assistant, command={"resume": True})
    ended = await read(
        await lg.threads.join_stream(thread, last_event_id=seen[-1][1], stream_mode="lifecycle"),
        lambda s: len(s) == 1,
    )
    assert lifecycle(ended) == [(run["run_id"], "success")]


async def test_a_thread_stream_refuses_a_mode_it_does_not_have_and_an_unknown_thread(
    tendon: LocalTendon,
) -> None:
    thread = (await client(tendon).threads.create())["thread_id"]
    async with httpx.AsyncClient(base_url=f"{tendon.url}/langgraph", timeout=10) as http:
        bad = await http.get(f"/threads/{thread}/stream", params={"stream_mode": "debug"})
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "not_supported"
        assert (await http.get("/threads/nobody/stream")).status_code == 404
        for odd in ("x", b"\x85", "1-2-3"):  # NEL is no blank: a stream that never ends must not open
            answer = await http.get(f"/threads/{thread}/stream", headers={"Last-Event-ID": odd})
            assert answer.status_code == 422, odd
