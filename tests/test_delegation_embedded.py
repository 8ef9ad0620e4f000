"""Delegation on the embedded backend (SQLite, the local queue, all in this process): a lead agent
whose two delegates run as child turns in child threads of its session, their answers its tools'
results; a named thread keeps a child's context; a budget ends a child with its partial result or
fails it; a cycle is refused; a cancel of the lead cancels its children and their running tools;
`brain history` of the lead shows what each child spent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from brain import verbs
from brain.rules.agents import AgentDefinition
from brain.rules.controls import Kind
from brain.verbs import controls
from infra.process.killpoints import KillPoints
from infra.process.settings import Settings
from infra.transport import Topology
from local.embedded import DataDir, LocalSystem, run_local
from local.testing import local_tendon
from tests.support import wait_for

NS = "default"


def agent(name: str, script: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"name": name, "version": "1", "model": {"kind": "scripted", "script": script}, **fields}


def lead(delegates: dict[str, Any], calls: list[dict[str, Any]], name: str = "lead") -> AgentDefinition:
    script = [{"tool_calls": calls}, {"content": "answers:\n{results}"}]
    return AgentDefinition.model_validate(agent(name, script, delegates=delegates))


@pytest.fixture
async def system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalSystem]:
    monkeypatch.setenv("BULK_RUNS_FILE", str(tmp_path / "runs.txt"))
    settings = Settings(scan_interval=0.2, reconnect_grace=0.5, lease_seconds=10, http="off")
    async with run_local(
        settings,
        DataDir(tmp_path / "data"),
        pools=[("bulk", "tests.brain_e2e_tools")],
        killpoints=KillPoints(),
    ) as running:
        yield running


async def submit(
    system: LocalSystem, definition: AgentDefinition, request: str, session: str = "s", thread: str = "main"
) -> str:
    turn_id, _ = await verbs.submit(
        system.brain, namespace=NS, session_id=session, request_id=request, user_input="go",
        agent=definition, wake_channel=system.wake_channel, tools=verbs.KnownTools(served=system.served),
        thread=thread,
    )  # fmt: skip
    return turn_id


async def ended(system: LocalSystem, turn_id: str, timeout: float = 30) -> Any:
    async def done() -> Any:
        row = await system.brain.read(lambda c: c.fetchrow("SELECT * FROM turns WHERE id = $1", turn_id))
        return row if row["status"] in ("completed", "failed", "cancelled") else None

    return await wait_for(done, timeout=timeout, what=f"turn {turn_id} to end")


def _count(path: Path, words: str) -> int:
    return path.read_text().count(words) if path.exists() else 0


async def lines(path: Path, words: str, count: int) -> bool:
    return await asyncio.to_thread(_count, path, words) == count


async def rows(system: LocalSystem, sql: str, *args: Any) -> list[Any]:
    return list(await system.brain.read(lambda c: c.fetch(sql, *args)))


async def test_a_lead_delegates_to_two_children_and_answers_with_both(system: LocalSystem) -> None:
    # Given a lead with two delegates, one in a thread per call and one in a named thread
    delegates = {
        "research": {"agent": agent("researcher", [{"content": "found: water is wet"}])},
        "review": {"agent": agent("reviewer", [{"content": "reviewed ok"}]), "thread": "reviews"},
    }
    calls = [
        {"tool": "research", "args": {"input": "is water wet?"}},
        {"tool": "review", "args": {"input": "A"}},
    ]
    turn = await submit(system, lead(delegates, calls), "r1")

    # Then it completes with both children's answers as its tools' results
    done = await ended(system, turn)
    assert done["status"] == "completed", done["error"]
    assert "found: water is wet" in done["result"]["text"] and "reviewed ok" in done["result"]["text"]
    records = await rows(system, "SELECT * FROM delegations WHERE parent_turn_id = $1 ORDER BY call_id", turn)
    assert [(r["tool"], r["status"]) for r in records] == [("research", "settled"), ("review", "settled")]
    children = {r["tool"]: r for r in records}
    assert children["review"]["child_thread_id"] == "default/s/reviews"
    assert children["research"]["child_thread_id"] == f"default/s/d-{children['research']['execution_id']}"
    child_turns = await rows(system, "SELECT * FROM turns WHERE request_id LIKE 'delegate:%'")
    assert sorted(t["id"] for t in child_turns) == sorted(r["child_turn_id"] for r in records)
    inputs = await rows(
        system,
        "SELECT facts FROM journal WHERE turn_id = $1 ORDER BY seq",
        children["research"]["child_turn_id"],
    )
    assert inputs[0]["facts"][0]["input"] == {"text": "is water wet?"}

    # And the lead's stream names each child, and what it spent
    said = [f for r in await rows(system, "SELECT facts FROM journal WHERE turn_id = $1 ORDER BY seq", turn)
            for f in r["facts"]]  # fmt: skip
    delegated = [f for f in said if f["kind"] == "turn.delegated"]
    assert sorted(f["child_turn"] for f in delegated) == sorted(t["id"] for t in child_turns)
    answered = [f for f in said if f["kind"] == "tool.delegated"]
    assert [f["usage"]["model_calls"] for f in answered] == [1, 1]

    # And its history shows each child's cost, added up
    history = await verbs.history(system.brain, namespace=NS, turn_id=turn)
    assert len(history["children"]) == 2
    assert history["usage"]["model_calls"] == 2 + 2  # the lead's two, one per child


async def test_a_named_thread_keeps_the_childs_context_across_calls(system: LocalSystem) -> None:
    # Given a delegate whose child runs in the named thread "notes", called by two turns
    delegates = {"note": {"agent": agent("noter", [{"content": "noted"}]), "thread": "notes"}}
    calls = [{"tool": "note", "args": {"input": "one"}}]
    first = await ended(system, await submit(system, lead(delegates, calls), "n1"))
    second = await ended(system, await submit(system, lead(delegates, calls), "n2"))
    assert first["status"] == second["status"] == "completed"

    # Then both children ran in that one thread, the second after the first (its conversation
    # holds the first child's input and answer)
    records = await rows(system, "SELECT * FROM delegations ORDER BY created_at")
    assert {r["child_thread_id"] for r in records} == {"default/s/notes"}
    kids = await rows(system, "SELECT id FROM turns WHERE thread_id = 'default/s/notes' ORDER BY created_at")
    assert [k["id"] for k in kids] == [r["child_turn_id"] for r in records]


async def test_a_child_over_its_budget_ends_with_its_partial_result_or_fails(system: LocalSystem) -> None:
    # Given a child that would call tools forever, with a budget of 2 model calls
    endless = [{"tool_calls": [{"tool": "slow_step", "args": {"seconds": 0}}]}] * 10
    child = agent("looper", endless, tools=["slow_step"])
    for on_budget, request in (("partial", "b1"), ("fail", "b2")):
        delegates = {"loop": {"agent": child, "budget": {"model_calls": 2}, "on_budget": on_budget}}
        parent = lead(delegates, [{"tool": "loop", "args": {"input": "x"}}], name=f"lead-{on_budget}")
        turn = await submit(system, parent, request, session=request)
        done = await ended(system, turn)
        assert done["status"] == "completed", done["error"]
        (record,) = await rows(system, "SELECT * FROM delegations WHERE parent_turn_id = $1", turn)
        kid = (await rows(system, "SELECT * FROM turns WHERE id = $1", record["child_turn_id"]))[0]
        (call,) = await rows(system, "SELECT * FROM executions WHERE turn_id = $1", turn)
        assert kid["model_calls"] == 2
        if on_budget == "partial":
            assert kid["status"] == "completed"
            assert call["status"] == "succeeded" and call["how"] == "partial"
            assert call["result"]["partial"] is True
            assert [r["status"] for r in call["result"]["results"]] == ["succeeded", "succeeded"]
            assert "2 model calls" in call["result"]["reason"]
        else:
            assert kid["status"] == "failed" and "2 model calls" in kid["error"]["message"]
            assert call["status"] == "failed" and "2 model calls" in call["error"]["message"]


async def test_a_cycle_is_refused_with_a_clear_error(system: LocalSystem) -> None:
    # An agent delegating to one of its own name, and one delegating into its own thread
    again = {"again": {"agent": agent("lead-a", [{"content": "never"}], version="2")}}
    own = {"own": {"agent": agent("other", [{"content": "never"}]), "thread": "main"}}
    for delegates, tool, words in ((again, "again", "agent lead-a delegates to itself"),
                                   (own, "own", "thread 'main' would wait on itself")):  # fmt: skip
        parent = lead(delegates, [{"tool": tool, "args": {"input": "x"}}], name=f"lead-{tool[0]}")
        turn = await submit(system, parent, f"c-{tool}", session=f"c-{tool}")
        done = await ended(system, turn)
        assert done["status"] == "completed", done["error"]
        (call,) = await rows(system, "SELECT * FROM executions WHERE turn_id = $1", turn)
        assert (call["status"], call["how"]) == ("failed", "refused")
        assert words in call["error"]["message"], call["error"]
        assert not await rows(system, "SELECT id FROM turns WHERE request_id = $1", f"delegate:{call['id']}")


async def test_cancelling_the_lead_cancels_its_children_and_their_running_tools(
    system: LocalSystem, tmp_path: Path
) -> None:
    gate = str(tmp_path / "never")
    busy = agent("busy", [{"tool_calls": [{"tool": "slow_step", "args": {"seconds": 60, "gate": gate}}]},
                          {"content": "done"}], tools=["slow_step"])  # fmt: skip
    delegates = {"a": {"agent": busy}, "b": {"agent": {**busy, "name": "busy2"}}}
    calls = [{"tool": "a", "args": {"input": "x"}}, {"tool": "b", "args": {"input": "y"}}]
    turn = await submit(system, lead(delegates, calls), "x1")
    # Given both children running their tool
    runs = tmp_path / "runs.txt"
    await wait_for(lambda: lines(runs, "started", 2), timeout=30, what="both tools running")
    other = await submit(
        system, AgentDefinition.model_validate(agent("bystander", [{"content": "hi"}])), "o1", "s2"
    )

    # When the lead is cancelled
    await controls.control(
        system.brain, namespace=NS, turn_id=turn, request_id="stop", kind=Kind.CANCEL,
        topology=Topology(Settings().queue_prefix), wake_channel=system.wake_channel,
    )  # fmt: skip

    # Then both children end cancelled, their tools stopped by their own cancels
    records = await rows(system, "SELECT * FROM delegations WHERE parent_turn_id = $1", turn)
    assert len(records) == 2
    for r in records:
        assert (await ended(system, r["child_turn_id"]))["status"] == "cancelled"
    await wait_for(lambda: lines(runs, "stopped by a cancel", 2), timeout=30, what="both tools stopped")
    assert (await ended(system, other))["status"] == "completed"  # only its own children
    said = [f for r in await rows(system, "SELECT facts FROM journal WHERE turn_id = $1 ORDER BY seq", turn)
            for f in r["facts"]]  # fmt: skip
    asked = [f for f in said if f["kind"] == "tool.child_cancel_requested"]
    assert sorted(f["child_turn"] for f in asked) == sorted(r["child_turn_id"] for r in records)


async def test_a_child_stops_once_its_token_budget_is_spent(system: LocalSystem) -> None:
    # Given a child whose every reply costs 10 tokens, with a budget of 25
    step = {"tool_calls": [{"tool": "slow_step", "args": {"seconds": 0}}], "usage": {"total_tokens": 10}}
    child = agent("spender", [step] * 10, tools=["slow_step"])
    delegates = {"spend": {"agent": child, "budget": {"tokens": 25}}}
    turn = await submit(system, lead(delegates, [{"tool": "spend", "args": {"input": "x"}}]), "t1")

    # Then it made three model calls (30 tokens: the third took it past the bound), and no fourth
    done = await ended(system, turn)
    assert done["status"] == "completed", done["error"]
    (record,) = await rows(system, "SELECT * FROM delegations WHERE parent_turn_id = $1", turn)
    kid = (await rows(system, "SELECT * FROM turns WHERE id = $1", record["child_turn_id"]))[0]
    assert (kid["status"], kid["model_calls"]) == ("failed", 3)
    assert "25 tokens is spent (30 used)" in kid["error"]["message"]
    history = await verbs.history(system.brain, namespace=NS, turn_id=turn)
    assert history["children"][0]["usage"] == {"model_calls": 3, "total_tokens": 30}
    assert history["usage"]["total_tokens"] == 30


async def test_pausing_the_lead_does_not_pause_its_child(system: LocalSystem, tmp_path: Path) -> None:
    # Given a lead whose child runs a tool until a file exists
    gate = tmp_path / "go"
    step = {"tool_calls": [{"tool": "slow_step", "args": {"seconds": 60, "gate": str(gate)}}]}
    child = agent("worker", [step, {"content": "worked"}], tools=["slow_step"])
    turn = await submit(
        system, lead({"work": {"agent": child}}, [{"tool": "work", "args": {"input": "x"}}]), "p1"
    )
    await wait_for(lambda: lines(tmp_path / "runs.txt", "started", 1), timeout=30, what="the child's tool")
    topology = Topology(Settings().queue_prefix)

    # When the lead is paused, and the child's tool then finishes
    paused = await controls.control(
        system.brain, namespace=NS, turn_id=turn, request_id="hold", kind=Kind.PAUSE, topology=topology,
        wake_channel=system.wake_channel,
    )  # fmt: skip
    assert paused.status == "applied"
    await asyncio.to_thread(gate.write_text, "")

    # Then the child completes, its answer is the lead's call's result, and the lead stays paused
    (record,) = await rows(system, "SELECT * FROM delegations WHERE parent_turn_id = $1", turn)
    assert (await ended(system, record["child_turn_id"]))["status"] == "completed"

    async def answered() -> Any:
        (call,) = await rows(system, "SELECT * FROM executions WHERE turn_id = $1", turn)
        return call if call["status"] == "succeeded" else None

    assert (await wait_for(answered, timeout=30, what="the lead's call answered"))["result"][
        "text"
    ] == "worked"
    assert (await rows(system, "SELECT status FROM turns WHERE id = $1", turn))[0]["status"] == "paused"

    # And once resumed, the lead completes with it
    revision = (await rows(system, "SELECT revision FROM turns WHERE id = $1", turn))[0]["revision"]
    await controls.control(
        system.brain, namespace=NS, turn_id=turn, request_id="go", kind=Kind.RESUME, topology=topology,
        wake_channel=system.wake_channel, revision=revision,
    )  # fmt: skip
    assert "worked" in (await ended(system, turn))["result"]["text"]


async def test_children_delegate_further_and_the_lead_history_adds_every_level(system: LocalSystem) -> None:
    # Given lead -> planner -> writer, each level answering with what the one below said
    writer = agent("writer", [{"content": "a draft"}])
    plan = [
        {"tool_calls": [{"tool": "write", "args": {"input": "draft it"}}]},
        {"content": "plan: {results}"},
    ]
    planner = agent("planner", plan, delegates={"write": {"agent": writer}})
    turn = await submit(
        system, lead({"plan": {"agent": planner}}, [{"tool": "plan", "args": {"input": "x"}}]), "d1"
    )

    # Then the lead's answer holds the writer's, and its history each level's cost
    done = await ended(system, turn)
    assert done["status"] == "completed" and "a draft" in done["result"]["text"], done["error"]
    history = await verbs.history(system.brain, namespace=NS, turn_id=turn)
    (plan,) = history["children"]
    (write,) = plan["children"]
    assert (plan["agent"]["name"], write["agent"]["name"]) == ("planner", "writer")
    assert (write["usage"]["model_calls"], plan["usage"]["model_calls"], history["usage"]["model_calls"]) == (
        1,
        3,
        5,
    )
    (record,) = await rows(system, "SELECT chain FROM delegations WHERE agent_name = 'writer'")
    assert [link["agent"] for link in record["chain"]] == ["lead", "planner", "writer"]


async def test_a_named_thread_of_another_agent_is_refused_with_the_reason(system: LocalSystem) -> None:
    # Given a session whose thread "shared" a child of alpha made
    first = {"ask": {"agent": agent("alpha", [{"content": "a"}]), "thread": "shared"}}
    call = [{"tool": "ask", "args": {"input": "x"}}]
    assert (await ended(system, await submit(system, lead(first, call, name="l1"), "a1", "s1")))[
        "status"
    ] == "completed"

    # When another lead of the session (in another thread) delegates to beta in that thread
    second = {"ask": {"agent": agent("beta", [{"content": "b"}]), "thread": "shared"}}
    turn = await submit(system, lead(second, call, name="l2"), "a2", "s1", thread="other")

    # Then its call fails with the reason, and no child of beta exists
    assert (await ended(system, turn))["status"] == "completed"
    (refused,) = await rows(system, "SELECT * FROM executions WHERE turn_id = $1", turn)
    assert (refused["status"], refused["how"]) == ("failed", "refused")
    assert "pinned to agent alpha version 1" in refused["error"]["message"]
    assert not await rows(system, "SELECT id FROM turns WHERE request_id = $1", f"delegate:{refused['id']}")


async def test_the_readme_lead_agent_runs(tmp_path: Path) -> None:
    settings = Settings(scan_interval=0.5, reconnect_grace=0.5, lease_seconds=10, http="off")
    pools = [("hello", "examples.hello_tools")]
    async with run_local(
        settings, DataDir(tmp_path / "data"), pools=pools, killpoints=KillPoints()
    ) as system:
        definition = AgentDefinition.from_file(Path("examples/lead_agent.json"))
        done = await ended(system, await submit(system, definition, "readme"))
        assert done["status"] == "completed", done["error"]
        assert "Hello, world!" in done["result"]["text"] and "Yes, it is." in done["result"]["text"]


async def test_a_child_over_its_time_budget_fails_when_told_to(system: LocalSystem) -> None:
    nap = [{"tool_calls": [{"tool": "sleep", "args": {"seconds": 300}}]}, {"content": "woke"}]
    delegates = {"nap": {"agent": agent("sleeper", nap, tools=["sleep"]), "budget": {"seconds": 0.5}}}
    turn = await submit(system, lead(delegates, [{"tool": "nap", "args": {"input": "x"}}]), "s1")
    assert (await ended(system, turn))["status"] == "completed"
    (call,) = await rows(system, "SELECT * FROM executions WHERE turn_id = $1", turn)
    assert (call["status"], call["error"]["code"]) == ("failed", "limit_reached")
    assert "time budget" in call["error"]["message"]
    (record,) = await rows(system, "SELECT * FROM delegations WHERE parent_turn_id = $1", turn)
    assert (await ended(system, record["child_turn_id"]))["status"] == "cancelled"


async def test_over_http_a_lead_runs_and_its_history_and_stream_name_its_children(tmp_path: Path) -> None:
    # Given the development server (HTTP API), and the README's lead agent submitted through it
    definition = AgentDefinition.from_file(Path("examples/lead_agent.json"))
    async with local_tendon(tmp_path / "data", "examples.hello_tools") as local:
        turn = await local.run(definition, "Go", session="team")
        assert turn["status"] == "completed" and "Hello, world!" in turn["result"]["text"]

        # Then its history names both children with their cost, and the session's stream holds
        # the children's own entries beside the lead's facts that name them
        history = await local.client.history(turn["turn_id"])
        assert sorted(c["agent"]["name"] for c in history["children"]) == ["greeter", "reviewer"]
        assert history["usage"]["model_calls"] == 2 + 2 + 1
        async with httpx.AsyncClient(base_url=local.url, timeout=30) as http:
            page = (await http.get("/v1/sessions/team/events", params={"limit": 1000})).json()
        named = {f["child_turn"] for e in page["events"] for f in e["facts"] if f["kind"] == "turn.delegated"}
        assert named == {c["child_turn"] for c in history["children"]}
        assert named <= {e["turn_id"] for e in page["events"]}


async def test_a_child_makes_no_model_call_after_its_tool_call_budget(system: LocalSystem) -> None:
    # Given a child whose first reply asks for two tool calls, with a budget of one tool call
    two = {"tool_calls": [{"tool": "slow_step", "args": {"seconds": 0}}] * 2}
    child = agent("caller", [two, two, {"content": "never"}], tools=["slow_step"])
    delegates = {"call": {"agent": child, "budget": {"tool_calls": 1}, "on_budget": "partial"}}
    turn = await submit(system, lead(delegates, [{"tool": "call", "args": {"input": "x"}}]), "tc1")

    # Then the reply that crossed the bound was its last: its calls ran, no model call followed
    assert (await ended(system, turn))["status"] == "completed"
    (record,) = await rows(system, "SELECT * FROM delegations WHERE parent_turn_id = $1", turn)
    kid = (await rows(system, "SELECT * FROM turns WHERE id = $1", record["child_turn_id"]))[0]
    assert (kid["status"], kid["model_calls"]) == ("completed", 1)
    (call,) = await rows(system, "SELECT * FROM executions WHERE turn_id = $1", turn)
    assert call["how"] == "partial" and len(call["result"]["results"]) == 2
    assert "1 tool calls is spent (2 used)" in call["result"]["reason"]


async def test_a_child_cancelled_on_its_own_fails_its_call_and_the_lead_goes_on(
    system: LocalSystem, tmp_path: Path
) -> None:
    step = {"tool_calls": [{"tool": "slow_step", "args": {"seconds": 60, "gate": str(tmp_path / "never")}}]}
    child = agent("stuck", [step, {"content": "done"}], tools=["slow_step"])
    turn = await submit(
        system, lead({"go": {"agent": child}}, [{"tool": "go", "args": {"input": "x"}}]), "k1"
    )
    (record,) = await wait_for(
        lambda: rows(system, "SELECT * FROM delegations WHERE parent_turn_id = $1", turn), what="the child"
    )
    await wait_for(lambda: lines(tmp_path / "runs.txt", "started", 1), timeout=30, what="the child's tool")

    # When someone cancels the child itself
    await controls.control(
        system.brain, namespace=NS, turn_id=record["child_turn_id"], request_id="stop-child",
        kind=Kind.CANCEL, topology=Topology(Settings().queue_prefix), wake_channel=system.wake_channel,
    )  # fmt: skip

    # Then the lead's call fails saying so, and the lead goes on to its answer
    done = await ended(system, turn)
    assert done["status"] == "completed"
    (call,) = await rows(system, "SELECT * FROM executions WHERE turn_id = $1", turn)
    assert (call["status"], call["error"]["code"]) == ("failed", "child_cancelled")
