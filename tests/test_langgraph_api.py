"""The LangGraph-compatible API driven by the unmodified ``langgraph-sdk`` client, against a Brain
serving HTTP (the embedded backend in this process, with a Hands pool of ``examples.hello_tools``):
assistants are agents with versions, threads are sessions, a streamed run sends LangChain-style
messages of the model and its tool, a client that disconnects and joins the stream again with
the last event id gets the rest once, each multitask strategy does what Tendon's double texting
does, an interrupt is a call that waits for approval and ``command.resume`` answers it, a cancel
with rollback takes the run's messages out, a cron is a schedule, graph internals are refused by
name, and tokens keep namespaces apart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import ConflictError, NotFoundError, UnprocessableEntityError

from brain.api import hash_token
from infra.process.settings import Settings
from local.testing import LocalTendon, local_tendon
from tests.support import wait_for

HI = {"messages": [{"role": "user", "content": "greet Ada"}]}
GREET = {"tool_calls": [{"tool": "greet", "args": {"name": "Ada"}}]}
GUARDED = {"tools": ["greet"], "approvals": ["greet"],
           "model": {"kind": "scripted", "script": [GREET, {"content": "I greeted Ada."}]}}  # fmt: skip


@pytest.fixture
async def tendon(tmp_path: Path) -> AsyncIterator[LocalTendon]:
    async with local_tendon(tmp_path, "examples.hello_tools") as running:
        yield running


def client(tendon: LocalTendon, token: str | None = None) -> LangGraphClient:
    return get_client(url=f"{tendon.url}/langgraph", api_key=token)


async def parts(stream: AsyncIterator[Any]) -> list[tuple[str, str | None, Any]]:
    return [(p.event, p.id, p.data) for p in [p async for p in stream]]


def types(values: dict[str, Any]) -> list[str]:
    return [m["type"] for m in values["messages"]]


async def test_assistants_are_agents_with_versions_created_found_searched_and_set_latest(
    tendon: LocalTendon,
) -> None:
    lg = client(tendon)
    # Given an assistant made of an agent definition, and a second version of it
    first = await lg.assistants.create(graph_id="guarded", context={"agent": GUARDED}, metadata={"team": "a"})
    later = {**GUARDED, "instructions": "be brief"}
    second = await lg.assistants.update(first["assistant_id"], context={"agent": later})
    # Then each is found, by id and by search, and its versions are listed newest first
    assert (first["version"], second["version"], second["graph_id"]) == (1, 2, "guarded")
    assert (await lg.assistants.get(first["assistant_id"]))["version"] == 2
    assert [a["assistant_id"] for a in await lg.assistants.search(metadata={"team": "a"})] == [
        first["assistant_id"]
    ]
    assert await lg.assistants.search(metadata={"team": "b"}) == []
    assert [v["version"] for v in await lg.assistants.get_versions(first["assistant_id"])] == [2, 1]
    # When version 1 is set latest, runs use it again
    assert (await lg.assistants.set_latest(first["assistant_id"], 1))["version"] == 1
    # And an existing id is a conflict unless if_exists=do_nothing takes it
    with pytest.raises(ConflictError):
        await lg.assistants.create(graph_id="guarded", assistant_id=first["assistant_id"])
    same = await lg.assistants.create(
        graph_id="guarded", assistant_id=first["assistant_id"], if_exists="do_nothing"
    )
    assert same["version"] == 1
    # And a graph id with no agent behind it is not found, saying how to give one
    with pytest.raises(NotFoundError, match="context.agent"):
        await lg.assistants.create(graph_id="nobody")
    # And its graph is the loop every Tendon agent runs, its nodes named as a stream's updates name them
    graph = await lg.assistants.get_graph(first["assistant_id"])
    assert {n["id"] for n in graph["nodes"]} == {"__start__", "model", "tools", "__end__"}
    schemas = await lg.assistants.get_schemas(first["assistant_id"])
    assert schemas["state_schema"]["required"] == ["messages"]
    assert await lg.assistants.get_subgraphs(first["assistant_id"]) == {}


async def test_threads_are_sessions_made_searched_by_metadata_updated_and_deleted(
    tendon: LocalTendon,
) -> None:
    lg = client(tendon)
    made = await lg.threads.create(thread_id="t-1", metadata={"user": "ada"})
    await lg.threads.create(thread_id="t-2", metadata={"user": "bob"})
    assert (made["thread_id"], made["status"], made["values"]) == ("t-1", "idle", {"messages": []})
    with pytest.raises(ConflictError):
        await lg.threads.create(thread_id="t-1")
    assert (await lg.threads.create(thread_id="t-1", if_exists="do_nothing"))["metadata"] == {"user": "ada"}
    assert [t["thread_id"] for t in await lg.threads.search(metadata={"user": "ada"})] == ["t-1"]
    updated = await lg.threads.update("t-1", metadata={"tier": "gold"})
    assert updated["metadata"] == {"user": "ada", "tier": "gold"}
    # A value Tendon cannot keep as a string pair is refused, not turned into one
    with pytest.raises(UnprocessableEntityError, match="string pairs"):
        await lg.threads.update("t-1", metadata={"age": 7})
    # The thread is the session a /v1 client sees
    async with httpx.AsyncClient(base_url=tendon.url) as http:
        listed = (await http.get("/v1/sessions", params={"search": "t-1"})).json()
    assert [(s["id"], s["metadata"]) for s in listed["sessions"]] == [
        ("t-1", {"user": "ada", "tier": "gold"})
    ]
    await lg.threads.delete("t-2")
    with pytest.raises(NotFoundError):
        await lg.threads.get("t-2")
    assert [t["thread_id"] for t in await lg.threads.search()] == ["t-1"]
    with pytest.raises(ConflictError, match="deleted"):
        await lg.threads.create(thread_id="t-2")


async def test_a_streamed_run_sends_model_and_tool_messages_and_a_rejoin_from_the_last_id_gets_the_rest_once(
    tendon: LocalTendon, tmp_path: Path
) -> None:
    lg = client(tendon)
    gate = tmp_path / "go"
    slow = {"tools": ["greet"], "model": {"kind": "scripted",
            "script": [GREET, {"gate": str(gate), "content": "I greeted Ada."}]}}  # fmt: skip
    assistant = await lg.assistants.create(graph_id="greeter", context={"agent": slow})
    thread = (await lg.threads.create())["thread_id"]
    # When a client streams a run in messages-tuple and values modes and goes away once the tool answered
    seen: list[tuple[str, str | None, Any]] = []
    stream = lg.runs.stream(
        thread, assistant["assistant_id"], input=HI, stream_mode=["messages-tuple", "values"]
    )
    async for p in stream:
        seen.append((p.event, p.id, p.data))
        if p.event == "messages" and p.data[0]["type"] == "tool":
            break
    await stream.aclose()  # type: ignore[attr-defined]
    run_id = seen[0][2]["run_id"]
    assert seen[0][0] == "metadata"
    # Then the run goes on without it, and a join from the last id it saw gets the rest
    gate.touch()
    rest = await parts(lg.runs.join_stream(thread, run_id, last_event_id=seen[-1][1]))
    whole = await parts(lg.runs.join_stream(thread, run_id))
    assert seen[1:] + rest == whole[1:]  # nothing lost, nothing twice
    messages = [d[0] for e, _, d in whole if e == "messages"]
    assert [(m["type"], m["content"][:20]) for m in messages] == [
        ("ai", ""), ("tool", '{"greeting": "Hello,'), ("ai", "I greeted Ada."),
    ]  # fmt: skip
    assert messages[0]["tool_calls"][0] == {
        "name": "greet",
        "args": {"name": "Ada"},
        "id": "call-1",
        "type": "tool_call",
    }
    last = [d for e, _, d in whole if e == "values"][-1]
    assert messages[1]["tool_call_id"] == "call-1" and types(last) == ["human", "ai", "tool", "ai"]
    # And the run, the thread's state and its history say the same
    assert (await lg.runs.get(thread, run_id))["status"] == "success"
    assert [r["run_id"] for r in await lg.runs.list(thread)] == [run_id]
    # A run may name the thread's latest checkpoint (a branching client does), never an earlier one
    head = (await lg.threads.get_state(thread))["checkpoint"]
    with pytest.raises(UnprocessableEntityError, match="latest checkpoint"):
        await lg.runs.create(thread, assistant["assistant_id"], input=HI, checkpoint_id="1")
    state = await lg.threads.get_state(thread)
    assert state["values"] == last and state["next"] == []
    history = await lg.threads.get_history(thread)
    assert [types(h["values"]) for h in history] == [
        ["human", "ai", "tool", "ai"], ["human", "ai", "tool"], ["human", "ai"], ["human"],
    ]  # fmt: skip
    older = await lg.threads.get_history(thread, before=history[1]["checkpoint"], limit=1)
    assert older == [history[2]]
    assert await lg.runs.join(thread, run_id) == state["values"]
    gate.touch()
    again = await lg.runs.wait(thread, assistant["assistant_id"], input=HI, checkpoint=head)
    assert types(again) == ["human", "ai", "tool", "ai"] * 2


async def test_an_interrupt_is_a_call_awaiting_approval_that_command_resume_answers(
    tendon: LocalTendon,
) -> None:
    lg = client(tendon)
    assistant = (await lg.assistants.create(graph_id="guarded", context={"agent": GUARDED}))["assistant_id"]
    thread = (await lg.threads.create())["thread_id"]
    # When a run calls a tool that needs approval, it stops at an interrupt
    stopped = await lg.runs.wait(thread, assistant, input=HI)
    (interrupt,) = stopped["__interrupt__"]
    assert interrupt["value"] == {
        "awaits": "approval",
        "tool": "greet",
        "call_id": "call-1",
        "args": {"name": "Ada"},
    }
    assert (await lg.threads.get(thread))["status"] == "interrupted"
    state = await lg.threads.get_state(thread)
    assert state["next"] == ["tools"] and state["interrupts"] == [interrupt]
    # Then a resume that is no answer is refused, and an approval runs the tool and the turn ends
    with pytest.raises(UnprocessableEntityError, match="approve"):
        await lg.runs.create(thread, assistant, command={"resume": "maybe"})
    streamed = await parts(lg.runs.stream(thread, assistant, command={"resume": True}, stream_mode="updates"))
    assert [list(d) for e, _, d in streamed if e == "updates"] == [["tools"], ["model"]]
    done = await lg.threads.get_state(thread)
    assert types(done["values"]) == ["human", "ai", "tool", "ai"] and done["interrupts"] == []
    assert [r["status"] for r in await lg.runs.list(thread)] == ["success", "success"]
    # And with nothing waiting, a resume is refused as a conflict
    with pytest.raises(ConflictError, match="no interrupt"):
        await lg.runs.create(thread, assistant, command={"resume": True})
    # And a denial with a reason reaches the model as the call's error, the tool never run
    other = (await lg.threads.create())["thread_id"]
    await lg.runs.wait(other, assistant, input=HI)
    denied = await lg.runs.wait(
        other, assistant, command={"resume": {"decision": "deny", "reason": "not Ada"}}
    )
    tool = denied["messages"][2]
    assert (tool["type"], tool["status"]) == ("tool", "error") and "not Ada" in tool["content"]


async def test_each_multitask_strategy_does_what_double_texting_does(tendon: LocalTendon) -> None:
    lg = client(tendon)
    assistant = (await lg.assistants.create(graph_id="guarded", context={"agent": GUARDED}))["assistant_id"]
    # Given a thread whose run waits for an approval (its turn unfinished)
    thread = (await lg.threads.create())["thread_id"]
    first = await lg.runs.create(thread, assistant, input=HI)
    await lg.runs.join(thread, first["run_id"])
    # Then reject (LangGraph's default) refuses another run; enqueue queues it behind
    with pytest.raises(ConflictError, match="busy"):
        await lg.runs.create(thread, assistant, input=HI)
    queued = await lg.runs.create(thread, assistant, input=HI, multitask_strategy="enqueue")
    assert (await lg.runs.get(thread, queued["run_id"]))["status"] == "pending"
    # And interrupt cancels both, keeping the first's work in the thread
    newest = await lg.runs.wait(thread, assistant, input=HI, multitask_strategy="interrupt")
    statuses = {r["run_id"]: r["status"] for r in await lg.runs.list(thread)}
    assert (statuses[first["run_id"]], statuses[queued["run_id"]]) == ("interrupted", "interrupted")
    assert types(newest) == ["human", "ai", "tool", "human", "ai"]
    assert "interrupted by a new message" in newest["messages"][2]["content"]
    # And rollback cancels the one ahead and takes its messages out
    rolled = await lg.runs.wait(thread, assistant, input=HI, multitask_strategy="rollback")
    assert types(rolled) == ["human", "ai", "tool", "human", "ai"]
    assert len(await lg.runs.list(thread)) == 3  # the rolled-back run is gone, as LangGraph deletes it


async def test_a_cancel_interrupts_or_rolls_back_a_run(tendon: LocalTendon) -> None:
    lg = client(tendon)
    assistant = (await lg.assistants.create(graph_id="guarded", context={"agent": GUARDED}))["assistant_id"]
    thread = (await lg.threads.create())["thread_id"]
    kept = await lg.runs.create(thread, assistant, input=HI)
    await lg.runs.join(thread, kept["run_id"])
    await lg.runs.cancel(thread, kept["run_id"], wait=True)
    assert (await lg.runs.get(thread, kept["run_id"]))["status"] == "interrupted"
    gone = await lg.runs.create(thread, assistant, input=HI)
    await lg.runs.join(thread, gone["run_id"])
    await lg.runs.cancel(thread, gone["run_id"], action="rollback", wait=True)
    with pytest.raises(NotFoundError):
        await lg.runs.get(thread, gone["run_id"])
    assert types((await lg.threads.get_state(thread))["values"]) == ["human", "ai", "tool"]
    assert (await lg.threads.get(thread))["status"] == "idle"
    with pytest.raises(ConflictError, match="ended already"):
        await lg.runs.cancel(thread, kept["run_id"], action="rollback")


async def test_a_cron_on_a_thread_is_a_schedule_whose_runs_the_thread_lists(tendon: LocalTendon) -> None:
    lg = client(tendon)
    quick = {"model": {"kind": "scripted", "script": [{"content": "tick"}]}}
    assistant = (await lg.assistants.create(graph_id="ticker", context={"agent": quick}))["assistant_id"]
    thread = (await lg.threads.create())["thread_id"]
    cron = await lg.crons.create_for_thread(thread, assistant, schedule="* * * * * *", input=HI)
    assert (cron["thread_id"], cron["enabled"]) == (thread, True)
    assert [c["cron_id"] for c in await lg.crons.search(thread_id=thread)] == [cron["cron_id"]]
    for _ in range(100):
        runs = await lg.runs.list(thread)
        if any(r["status"] == "success" for r in runs):
            break
        await asyncio.sleep(0.05)
    assert any(r["status"] == "success" for r in runs), runs
    await lg.crons.delete(cron["cron_id"])
    assert await lg.crons.search(thread_id=thread) == []
    with pytest.raises(UnprocessableEntityError, match="timezone"):
        await lg.crons.create_for_thread(
            thread, assistant, schedule="* * * * *", input=HI, timezone="Europe/Paris"
        )


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"interrupt_before": ["tools"]}, "interrupt_before"),
    ({"interrupt_after": "*"}, "interrupt_after"),
    ({"checkpoint_id": "1"}, "checkpoint_id"),
    ({"stream_mode": "debug"}, "debug"),
    ({"context": {"user": "ada"}}, "context"),
    ({"config": {"configurable": {"model": "other"}}}, "configurable"),
    ({"command": {"goto": "model"}}, "goto"),
]


async def test_graph_internals_are_refused_naming_the_feature(tendon: LocalTendon) -> None:
    lg = client(tendon)
    assistant = (await lg.assistants.create(graph_id="guarded", context={"agent": GUARDED}))["assistant_id"]
    thread = (await lg.threads.create())["thread_id"]
    for asked, named in REFUSED:
        with pytest.raises(UnprocessableEntityError, match=named) as refused:
            await lg.runs.create(thread, assistant, input=HI, **asked)
        assert refused.value.response.json()["error"]["code"] == "not_supported"
    with pytest.raises(UnprocessableEntityError, match="update_state"):
        await lg.threads.update_state(thread, {"messages": []}, as_node="model")
    assert await lg.runs.list(thread) == []  # nothing was started


async def test_bearer_tokens_and_namespaces_keep_langgraph_clients_apart(tmp_path: Path) -> None:
    tokens = {"north": "tok-north", "south": "tok-south"}
    settings = Settings(
        scan_interval=0.2,
        reconnect_grace=0.5,
        api_tokens=",".join(f"{n}:{hash_token(t)}" for n, t in tokens.items()),
    )
    async with local_tendon(tmp_path, "examples.hello_tools", settings=settings) as running:
        north, south = client(running, tokens["north"]), client(running, tokens["south"])
        assistant = await north.assistants.create(graph_id="guarded", context={"agent": GUARDED})
        await north.threads.create(thread_id="shared", metadata={"owner": "north"})
        # The other namespace sees neither, and may use the same thread id for its own
        with pytest.raises(NotFoundError):
            await south.assistants.get(assistant["assistant_id"])
        with pytest.raises(NotFoundError):
            await south.threads.get("shared")
        assert (await south.threads.create(thread_id="shared"))["metadata"] == {}
        assert await south.assistants.search() == []
        # And no token, or an unknown one, is refused
        from langgraph_sdk.errors import AuthenticationError

        for stranger in (client(running, None), client(running, "tok-nobody")):
            with pytest.raises(AuthenticationError):
                await stranger.threads.search()


async def test_run_options_stateless_if_not_exists_after_seconds_on_disconnect_and_other_modes(
    tendon: LocalTendon, tmp_path: Path
) -> None:
    lg = client(tendon)
    quick = {"tools": ["greet"], "model": {"kind": "scripted", "script": [GREET, {"content": "done"}]}}
    assistant = (await lg.assistants.create(graph_id="quick", context={"agent": quick}))["assistant_id"]
    # A stateless run makes its thread; a run on a thread that is not there makes it when asked to
    said = await lg.runs.wait(None, assistant, input=HI)
    assert types(said) == ["human", "ai", "tool", "ai"]
    with pytest.raises(NotFoundError):
        await lg.runs.create("t-new", assistant, input=HI)
    made = await lg.runs.create("t-new", assistant, input=HI, if_not_exists="create")
    # Its stream is read again in other modes: events and Tendon's own facts as custom parts
    again = await parts(lg.runs.join_stream("t-new", made["run_id"], stream_mode=["events", "custom"]))
    events = [d["event"] for e, _, d in again if e == "events"]
    assert events == ["on_chat_model_end", "on_tool_end", "on_chat_model_end", "on_chain_end"]
    facts = [d["tendon"]["kind"] for e, _, d in again if e == "custom"]
    assert {"execution.intended", "execution.succeeded", "turn.completed"} <= set(facts)
    # A run after_seconds is pending until its schedule fires, then runs
    later = await lg.runs.create("t-new", assistant, input=HI, after_seconds=1)
    assert later["status"] == "pending"
    assert types(await lg.runs.join("t-new", later["run_id"]))[-4:] == ["human", "ai", "tool", "ai"]
    assert (await lg.runs.get("t-new", later["run_id"]))["status"] == "success"
    # A stream asked to cancel its run on disconnect does, once the client goes away
    gate = tmp_path / "go"
    held = {"model": {"kind": "scripted", "script": [{"gate": str(gate), "content": "late"}]}}
    waiting = (await lg.assistants.create(graph_id="held", context={"agent": held}))["assistant_id"]
    thread = (await lg.threads.create())["thread_id"]
    stream = lg.runs.stream(thread, waiting, input=HI, on_disconnect="cancel")
    run_id = (await stream.__anext__()).data["run_id"]  # type: ignore[attr-defined]
    assert (await lg.threads.get(thread))["status"] == "busy"
    await stream.aclose()  # type: ignore[attr-defined]
    async with httpx.AsyncClient(base_url=tendon.url) as http:
        (turn,) = (await http.get(f"/v1/sessions/{thread}/turns")).json()

        async def cancel_received() -> bool:
            return bool((await http.get(f"/v1/turns/{turn['id']}/controls")).json())

        await wait_for(cancel_received, timeout=10, what="the cancel of a stream that went away")
    gate.touch()
    await lg.runs.join(thread, run_id)
    assert (await lg.runs.get(thread, run_id))["status"] == "interrupted"
    # And without it (the default), going away changes nothing of the run (invariant 13)
    gate2 = tmp_path / "go-2"
    held2 = {"model": {"kind": "scripted", "script": [{"gate": str(gate2), "content": "late"}]}}
    waiting2 = (await lg.assistants.create(graph_id="held2", context={"agent": held2}))["assistant_id"]
    thread2 = (await lg.threads.create())["thread_id"]
    kept = lg.runs.stream(thread2, waiting2, input=HI)
    run_id = (await kept.__anext__()).data["run_id"]  # type: ignore[attr-defined]
    await kept.aclose()  # type: ignore[attr-defined]
    await asyncio.sleep(0.5)
    assert (await lg.runs.get(thread2, run_id))["status"] == "running"
    gate2.touch()
    await lg.runs.join(thread2, run_id)
    assert (await lg.runs.get(thread2, run_id))["status"] == "success"
