"""A LangGraph thread copy, driven by the unmodified ``langgraph-sdk`` client: a new thread whose
conversation is the source's as it stands (snapped back to where every tool call had its result),
with the source's metadata, agent version and lineage. A run on the copy sends the model that
history, and no tool of it runs again; a copy of a thread stopped at an interrupt carries no
stale approval; a thread with no run yet copies its metadata only. On the embedded backend in this
process, with the real chat-completions adapter against the local chat server (which records
what the model was sent)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import NotFoundError

from brain.verbs import forks
from local.testing import LocalTendon, local_tendon
from protocol import ConflictError
from tests.chat_server import ChatServer, Reply
from tests.test_forks import no_dangling_call, said

GREET = {"tool_calls": [{"tool": "greet", "args": {"name": "Ada"}}]}
GUARDED = {"tools": ["greet"], "approvals": ["greet"],
           "model": {"kind": "scripted", "script": [GREET, {"content": "I greeted Ada."}]}}  # fmt: skip


def policy(body: dict[str, Any]) -> Reply:
    """``greet NAME`` calls greet; a tool result is answered ``done``; anything else ``ok``."""
    last = body["messages"][-1]
    if last["role"] == "user" and last["content"].startswith("greet "):
        name = last["content"].split()[-1]
        return Reply(tool_calls=[("greet", json.dumps({"name": name}))], call_ids=[f"call-{name}"])
    return Reply(content="done" if last["role"] == "tool" else "ok")


def agent(url: str) -> dict[str, Any]:
    model = {"kind": "openai", "name": "test-model", "base_url": url, "timeout": 10}
    return {"name": "copier", "version": "1", "tools": ["greet"], "model": model}


def ask(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


@pytest.fixture
async def tendon(tmp_path: Path) -> AsyncIterator[LocalTendon]:
    async with local_tendon(tmp_path, "examples.hello_tools") as running:
        yield running


def client(tendon: LocalTendon) -> LangGraphClient:
    return get_client(url=f"{tendon.url}/langgraph")


async def executions(http: httpx.AsyncClient, thread: str) -> list[str]:
    snap = (await http.get(f"/v1/sessions/{thread}/snapshot")).json()
    return [e["id"] for t in snap["turns"] for e in t["executions"]]


async def test_a_copy_carries_the_conversation_metadata_and_agent_and_a_run_on_it_runs_no_tool_again(
    tendon: LocalTendon,
) -> None:
    lg = client(tendon)
    async with httpx.AsyncClient(base_url=tendon.url, timeout=30) as http:
        with ChatServer(policy) as chat:
            # Given a thread with metadata whose run called a tool
            assistant = (await lg.assistants.create(graph_id="copier", context={"agent": agent(chat.url)}))[
                "assistant_id"
            ]
            source = (await lg.threads.create(metadata={"user": "ada"}))["thread_id"]
            await lg.runs.wait(source, assistant, input=ask("greet Ada"))
            ran = await executions(http, source)
            assert len(ran) == 1
            before = await lg.threads.get(source)

            # When it is copied
            made: Any = await lg.threads.copy(source)

            # Then the copy is a new thread with the same conversation and metadata, idle
            assert made["thread_id"] != source and made["metadata"] == {"user": "ada"}
            assert made["status"] == "idle"
            assert made["values"] == before["values"]
            assert [m["type"] for m in made["values"]["messages"]] == ["human", "ai", "tool", "ai"]
            copied = made["thread_id"]
            assert (await lg.threads.get(copied))["values"] == before["values"]
            assert (await lg.threads.get_state(copied))["values"] == before["values"]
            # and its lineage is kept: its main thread was forked from the source's
            (main,) = (await http.get(f"/v1/sessions/{copied}/threads")).json()
            (pinned,) = (await http.get(f"/v1/sessions/{source}/threads")).json()
            assert (main["name"], main["forked_from"]) == ("main", source)
            assert [main[k] for k in ("agent_name", "agent_version")] == [
                pinned[k] for k in ("agent_name", "agent_version")
            ]

            # When a run goes on in the copy
            sent_at = len(chat.requests)
            done = await lg.runs.wait(copied, assistant, input=ask("say hi"))

            # Then its model was sent the source's history, every call answered, and no tool ran again
            sent = chat.requests[sent_at]["messages"]
            assert said(sent) == [
                "user:greet Ada", "assistant:greet", "tool:Hello, Ada!", "assistant:done", "user:say hi"
            ]  # fmt: skip
            assert no_dangling_call(sent)
            assert await executions(http, copied) == [] and await executions(http, source) == ran
            tool = json.loads(next(m for m in sent if m["role"] == "tool")["content"])
            assert tool["result"]["operation_id"] == ran[0]  # the recorded result, by its execution
            assert [m["type"] for m in done["messages"]] == ["human", "ai", "tool", "ai", "human", "ai"]
            # and the source did not change
            assert (await lg.threads.get(source))["values"] == before["values"]


async def test_a_copy_of_an_interrupted_thread_carries_no_stale_approval(tendon: LocalTendon) -> None:
    lg = client(tendon)
    assistant = (await lg.assistants.create(graph_id="guarded", context={"agent": GUARDED}))["assistant_id"]
    source = (await lg.threads.create())["thread_id"]
    stopped = await lg.runs.wait(source, assistant, input=ask("greet Ada"))
    assert stopped["__interrupt__"]
    # A copy of a thread waiting for an approval is cut before the call that waits
    made: Any = await lg.threads.copy(source)
    assert made["status"] == "idle" and made["interrupts"] == {}
    assert [m["type"] for m in made["values"]["messages"]] == ["human"]
    state = await lg.threads.get_state(made["thread_id"])
    assert state["next"] == [] and state["interrupts"] == []
    # and nothing of the copy answers the source's interrupt: a resume there finds none
    with pytest.raises(Exception, match="no interrupt"):
        await lg.runs.create(made["thread_id"], assistant, command={"resume": True})
    # while the source still waits for its approval
    assert (await lg.threads.get(source))["status"] == "interrupted"


async def test_a_thread_with_no_run_copies_its_metadata_and_a_missing_one_is_not_found(
    tendon: LocalTendon,
) -> None:
    lg = client(tendon)
    source = (await lg.threads.create(metadata={"tier": "gold"}))["thread_id"]
    made: Any = await lg.threads.copy(source)
    assert (made["metadata"], made["values"], made["status"]) == ({"tier": "gold"}, {"messages": []}, "idle")
    # a copy is searchable by its metadata like any thread
    found = {t["thread_id"] for t in await lg.threads.search(metadata={"tier": "gold"})}
    assert found == {source, made["thread_id"]}
    with pytest.raises(NotFoundError):
        await lg.threads.copy("no-such-thread")
    await lg.threads.delete(source)
    with pytest.raises(NotFoundError):
        await lg.threads.copy(source)
    # another namespace's thread of that id is not found, and a copy never takes an id in use
    with pytest.raises(Exception, match="no session"):
        await forks.copy(tendon.system.brain, "other", made["thread_id"], "x")
    with pytest.raises(ConflictError):
        await forks.copy(tendon.system.brain, "default", made["thread_id"], made["thread_id"])
