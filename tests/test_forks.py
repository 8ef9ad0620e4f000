"""Fork and rewind: a new thread (or the same one, set back) whose conversation is a thread's up to a
journal seq, snapped back to where every tool call had its result. The model of a fork sees that
conversation and no dangling call, its results are the recorded ones (no tool runs again), the
lineage is kept and listed, a busy thread is not rewound, and another namespace's thread is not
found. On the embedded backend in this process, with the real chat-completions adapter against the
local chat server (which records what the model was sent)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from brain.store import open_store
from brain.verbs import forks, submit
from brain.verbs.sessions import threads
from local.testing import LocalTendon, agent_of, local_tendon
from protocol import IllegalTransitionError, NotFoundError
from tests.chat_server import ChatServer, Reply
from tests.support import TendonEnv, run_cli

SESSION = "s-fork"


def policy(body: dict[str, Any]) -> Reply:
    """``greet NAME`` calls greet, a tool result is answered ``done``, ``slow`` takes two seconds."""
    last = body["messages"][-1]
    if last["role"] == "user" and last["content"].startswith("greet "):
        name = last["content"].split()[-1]
        return Reply(tool_calls=[("greet", json.dumps({"name": name}))], call_ids=[f"call-{name}"])
    return Reply(
        content="done" if last["role"] == "tool" else "ok", delay=2.0 if last["content"] == "slow" else 0
    )


def agent(url: str) -> dict[str, Any]:
    model = {"kind": "openai", "name": "test-model", "base_url": url, "timeout": 10}
    return {"name": "forker", "version": "1", "tools": ["greet"], "model": model}


def said(messages: list[dict[str, Any]]) -> list[str]:
    """The conversation a model was sent, in short: ``role:what``."""
    out = []
    for m in messages:
        if m["role"] == "assistant":
            calls = [c["function"]["name"] for c in m.get("tool_calls") or []]
            out.append(f"assistant:{m['content'] or ''}{','.join(calls)}")
        elif m["role"] == "tool":
            out.append(f"tool:{json.loads(m['content'])['result']['greeting']}")
        else:
            out.append(f"{m['role']}:{m['content']}")
    return out


def no_dangling_call(messages: list[dict[str, Any]]) -> bool:
    called = [c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    answered = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    return called == answered


TURN_1 = ["user:greet Ada", "assistant:greet", "tool:Hello, Ada!", "assistant:done"]
TURN_2 = ["user:greet Bob", "assistant:greet", "tool:Hello, Bob!", "assistant:done"]


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalTendon]:
    async with local_tendon(tmp_path, "examples.hello_tools") as running:
        yield running


async def two_turns(local: LocalTendon, url: str, http: httpx.AsyncClient) -> list[dict[str, Any]]:
    """Greet Ada, then Bob, on the session's main thread; the session's journal entries."""
    for text in ("greet Ada", "greet Bob"):
        await local.wait(await local.submit(agent(url), text, session=SESSION))
    return list((await http.get(f"/v1/sessions/{SESSION}/events", params={"limit": 1000})).json()["events"])


async def executions(http: httpx.AsyncClient) -> int:
    snap = (await http.get(f"/v1/sessions/{SESSION}/snapshot")).json()
    return sum(len(t["executions"]) for t in snap["turns"])


async def ask(local: LocalTendon, chat: ChatServer, text: str, thread: str) -> list[dict[str, Any]]:
    """Submit ``text`` to ``thread``; what the model was sent for it."""
    before = len(chat.requests)
    turn = await local.wait(await local.submit(agent(chat.url), text, session=SESSION, thread=thread))
    assert turn["status"] == "completed", turn
    return list(chat.requests[before]["messages"])


async def test_forks_at_several_points_start_from_a_boundary_and_never_run_a_tool_again(
    local: LocalTendon,
) -> None:
    async with httpx.AsyncClient(base_url=local.url, timeout=30) as http:
        with ChatServer(policy) as chat:
            # Given a thread with two turns that each called a tool
            entries = await two_turns(local, chat.url, http)
            seqs = {f["kind"] + (":call" if f.get("message", {}).get("tool_calls") else ""): e["seq"]
                    for e in entries for f in e["facts"]}  # fmt: skip
            end_of_first = max(e["seq"] for e in entries if e["turn_id"] == entries[0]["turn_id"])
            second_calls = max(
                e["seq"] for e in entries if any(f["kind"] == "execution.intended" for f in e["facts"])
            )
            assert seqs["turn.model_replied:call"] == second_calls

            # When it is forked at its end, at the end of its first turn, and between the second
            # turn's tool call and its result
            made = {}
            for name, at in (("f-end", None), ("f-first", end_of_first), ("f-mid", second_calls)):
                params = {"name": name} | ({"at": str(at)} if at is not None else {})
                answer = await http.post(f"/v1/threads/{SESSION}/fork", params=params)
                assert answer.status_code == 201, answer.text
                made[name] = answer.json()
            ran = await executions(http)

            # Then each fork's model sees the conversation up to a boundary, with every call answered
            end = await ask(local, chat, "say hi", "f-end")
            first = await ask(local, chat, "say hi", "f-first")
            mid = await ask(local, chat, "say hi", "f-mid")
            assert said(end) == [*TURN_1, *TURN_2, "user:say hi"]
            assert said(first) == [*TURN_1, "user:say hi"]
            assert said(mid) == [*TURN_1, "user:greet Bob", "user:say hi"]
            assert all(no_dangling_call(m) for m in (end, first, mid))
            # the call cut from its result was snapped back before it; the others were not moved
            assert end_of_first <= made["f-mid"]["snapped_to"] < second_calls
            assert made["f-first"]["snapped_to"] == end_of_first
            assert made["f-end"]["at"] == made["f-end"]["snapped_to"] == entries[-1]["seq"]
            # and the results are the recorded ones: no tool ran again
            assert await executions(http) == ran == 2

            # And the lineage is kept and listed
            threads = {t["name"]: t for t in (await http.get(f"/v1/sessions/{SESSION}/threads")).json()}
            assert (
                threads["f-mid"]["forked_from"] == SESSION and threads["f-mid"]["forked_at"] == second_calls
            )
            assert threads["main"]["forked_from"] is None
            # a fork of a fork carries its own parent's conversation on
            again = (
                await http.post(f"/v1/threads/{SESSION}/f-first/fork", params={"name": "f-again"})
            ).json()
            assert again["forked_from"] == f"{SESSION}/f-first"
            assert said(await ask(local, chat, "once more", "f-again")) == [
                *TURN_1, "user:say hi", "assistant:ok", "user:once more"
            ]  # fmt: skip


async def test_a_fork_is_idempotent_by_name_and_refuses_what_it_cannot_be(local: LocalTendon) -> None:
    async with httpx.AsyncClient(base_url=local.url, timeout=30) as http:
        with ChatServer(policy) as chat:
            entries = await two_turns(local, chat.url, http)
            at = str(entries[2]["seq"])
            first = await http.post(f"/v1/threads/{SESSION}/fork", params={"at": at, "name": "same"})
            again = await http.post(f"/v1/threads/{SESSION}/fork", params={"at": at, "name": "same"})
            assert (first.status_code, again.status_code) == (201, 200)
            assert again.json() == first.json() | {"created": False}
            other = await http.post(f"/v1/threads/{SESSION}/fork", params={"at": "1", "name": "same"})
            assert other.status_code == 409 and other.json()["error"]["code"] == "conflict"
            past = await http.post(f"/v1/threads/{SESSION}/fork", params={"at": "100000"})
            assert past.status_code == 422
            missing = await http.post(f"/v1/threads/{SESSION}/nothing/fork")
            assert missing.status_code == 404
        # another namespace's thread of that id is not found
        with pytest.raises(NotFoundError):
            await forks.fork(local.system.brain, "other", SESSION)
        with pytest.raises(NotFoundError):
            await forks.rewind(local.system.brain, "other", SESSION, 1)


async def test_rewind_sets_an_idle_thread_back_and_refuses_a_busy_one(local: LocalTendon) -> None:
    async with httpx.AsyncClient(base_url=local.url, timeout=30) as http:
        with ChatServer(policy) as chat:
            entries = await two_turns(local, chat.url, http)
            end_of_first = max(e["seq"] for e in entries if e["turn_id"] == entries[0]["turn_id"])
            # A busy thread is refused, and nothing changes
            slow = await local.submit(agent(chat.url), "slow", session=SESSION)
            busy = await http.post(f"/v1/threads/{SESSION}/rewind", params={"at": str(end_of_first)})
            assert busy.status_code == 409 and "unfinished" in busy.json()["error"]["message"]
            await local.wait(slow)
            # An idle one goes on from where it was set back to, its results as they were recorded
            ran = await executions(http)
            back = await http.post(f"/v1/threads/{SESSION}/rewind", params={"at": str(end_of_first)})
            assert back.status_code == 200 and back.json()["snapped_to"] == end_of_first
            sent = await ask(local, chat, "say hi", "main")
            assert said(sent) == [*TURN_1, "user:say hi"]
            assert await executions(http) == ran
            # the turns after the rewind build on it
            assert said(await ask(local, chat, "and again", "main")) == [
                *TURN_1, "user:say hi", "assistant:ok", "user:and again"
            ]  # fmt: skip


async def test_the_cli_forks_and_rewinds_through_a_brains_api(local: LocalTendon) -> None:
    async with httpx.AsyncClient(base_url=local.url, timeout=30) as http:
        with ChatServer(policy) as chat:
            entries = await two_turns(local, chat.url, http)
    at = str(entries[-1]["seq"])
    code, out, err = await run_cli(
        ["-m", "brain", "fork", SESSION, "--at", at, "--name", "cli", "--url", local.url], {}
    )
    assert code == 0, err
    assert out.strip() == f"thread {SESSION}/cli forked from {SESSION} at {at}: 8 message(s)"
    code, out, err = await run_cli(["-m", "brain", "threads", SESSION, "--url", local.url], {})
    assert code == 0 and f"forked from {SESSION} at {at}" in out.splitlines()[-1], (out, err)
    code, out, err = await run_cli(
        ["-m", "brain", "rewind", f"{SESSION}/cli", "--at", "1", "--url", local.url], {}
    )
    assert code == 0, err
    assert out.strip() == f"thread {SESSION}/cli set back at 1: 0 message(s)"
    code, out, err = await run_cli(["-m", "brain", "fork", "nobody", "--url", local.url], {})
    assert (code, out) == (2, "") and err.strip() == "brain: there is no thread 'nobody'"


async def test_on_postgresql_a_fork_keeps_its_lineage_and_a_busy_thread_is_not_rewound(
    tendon: TendonEnv,
) -> None:
    store = await open_store(tendon.settings())
    try:
        model = {"kind": "scripted", "script": [{"content": "hi"}]}
        spec = {"name": "pg-forker", "version": "1", "model": model}
        await submit(store, namespace="ns", session_id="s-pg", request_id="r1", user_input="hello",
                     agent=agent_of(spec), wake_channel="wake")  # fmt: skip
        made = await forks.fork(store, "ns", "s-pg", name="copy")
        assert made | {"at": 0} == {
            "thread_id": "s-pg/copy", "session_id": "s-pg", "thread": "copy", "forked_from": "s-pg", "at": 0,
            "snapped_to": made["at"], "messages": 0, "created": True,
        }  # fmt: skip
        listed = {t["name"]: t for t in await threads(store, namespace="ns", session_id="s-pg")}
        assert (listed["copy"]["forked_from"], listed["copy"]["forked_at"]) == ("s-pg", made["at"])
        assert listed["copy"]["agent_version"] == listed["main"]["agent_version"]
        with pytest.raises(IllegalTransitionError, match="1 unfinished turn"):
            await forks.rewind(store, "ns", "s-pg", 1)  # its turn is queued
        with pytest.raises(NotFoundError):
            await forks.fork(store, "other", "s-pg")
    finally:
        await store.close()


async def test_a_fork_of_a_turn_waiting_for_an_approval_carries_no_stale_approval(local: LocalTendon) -> None:
    async with httpx.AsyncClient(base_url=local.url, timeout=30) as http:
        with ChatServer(policy) as chat:
            # Given a turn whose tool call waits for a person's approval
            careful = agent(chat.url) | {"approvals": ["greet"]}
            waiting = await local.submit(careful, "greet Cy", session=SESSION)
            for _ in range(100):
                if (await local.client.turn(waiting))["status"] == "waiting":
                    break
                await asyncio.sleep(0.05)
            # When its thread is forked at its end
            made = (await http.post(f"/v1/threads/{SESSION}/fork", params={"name": "f-wait"})).json()
            # Then the fork starts before the call, and its own turn neither waits for that approval
            # nor sends the model a call without its result
            before = len(chat.requests)
            turn = await local.wait(
                await local.submit(careful, "say hi", session=SESSION, thread="f-wait"), within=20
            )
            assert turn["status"] == "completed" and turn["executions"] == []
            assert said(chat.requests[before]["messages"]) == ["user:greet Cy", "user:say hi"]
            assert made["snapped_to"] < made["at"]
            assert (await local.client.turn(waiting))["status"] == "waiting"  # the parent's call still waits
