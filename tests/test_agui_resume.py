"""AG-UI runs that stop and go on: a frontend tool (a tool of the client's ``RunAgentInput.tools``)
is a manual tool of the turn, the run ends at its call with AG-UI's interrupt outcome and a state
snapshot saying what waits, and the client's next run carrying the tool's result as a ``tool``
message goes on with the same turn; an approval is answered by ``resume`` entries (resolved or
cancelled); an answer to nothing that waits is refused, saying so. Every event is validated by the
``ag-ui-protocol`` package's models (``tests.test_agui.read``). On the embedded backend."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from local.testing import LocalTendon, local_tendon
from tests.test_agui import read, types

ASKER = {
    "name": "asker", "version": "1", "tools": [],
    "model": {"kind": "scripted", "script": [
        {"tool_calls": [{"tool": "confirm", "args": {"question": "send it?"}}]},
        {"content": "The user said: {results}"},
    ]},
}  # fmt: skip
CONFIRM = {"name": "confirm", "description": "ask the user to confirm",
           "parameters": {"type": "object", "properties": {"question": {"type": "string"}}}}  # fmt: skip
GUARDED = {
    "name": "guarded", "version": "1", "tools": ["greet"], "approvals": ["greet"],
    "model": {"kind": "scripted", "script": [
        {"tool_calls": [{"tool": "greet", "args": {"name": "Ada"}}]}, {"content": "Done: {results}"},
    ]},
}  # fmt: skip
RUN = "/v1/agui/run"


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalTendon]:
    async with local_tendon(tmp_path, "examples.hello_tools") as running:
        yield running


def run_input(
    thread: str, run: str, agent: dict[str, Any], messages: list[Any], **more: Any
) -> dict[str, Any]:
    return {"threadId": thread, "runId": run, "messages": messages, "tools": more.pop("tools", []),
            "state": {}, "context": [], "forwardedProps": {"agent": agent}, **more}  # fmt: skip


USER = {"id": "u1", "role": "user", "content": "ask before sending"}


async def test_a_frontend_tool_stops_the_run_and_its_result_in_the_next_run_goes_on_with_the_turn(
    local: LocalTendon,
) -> None:
    # When a run offers a tool the client runs, and the model calls it
    first = await read(
        local.url, RUN, until="RUN_FINISHED", method="POST",
        json=run_input("s-front", "r-1", ASKER, [USER], tools=[CONFIRM]),
    )  # fmt: skip
    # Then the run ends at the call: its tool call, what waits in the state, an interrupt outcome
    assert types(first) == [
        "RUN_STARTED", "STEP_STARTED", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "STEP_FINISHED",
        "STATE_SNAPSHOT", "RUN_FINISHED",
    ]  # fmt: skip
    events = [e for _, e in first]
    call = next(e for e in events if e.type == "TOOL_CALL_START")
    assert call.tool_call_name == "confirm"
    (snapshot,) = [e for e in events if e.type == "STATE_SNAPSHOT"]
    assert snapshot.snapshot["waiting_for"] == [
        {"call_id": call.tool_call_id, "tool": "confirm", "awaits": "result"}
    ]
    finished = events[-1]
    assert (finished.thread_id, finished.run_id, finished.outcome.type) == ("s-front", "r-1", "interrupt")
    assert [(i.id, i.tool_call_id) for i in finished.outcome.interrupts] == [(call.tool_call_id,) * 2]

    # When the client sends the tool's result as a tool message in its next run
    asked = {"id": call.tool_call_id, "type": "function", "function": {"name": "confirm", "arguments": "{}"}}
    said = [
        USER,
        {"id": "a1", "role": "assistant", "toolCalls": [asked]},
        {"id": "t1", "role": "tool", "toolCallId": call.tool_call_id, "content": '{"confirmed": true}'},
    ]
    second = await read(
        local.url, RUN, until="RUN_FINISHED", method="POST",
        json=run_input("s-front", "r-2", ASKER, said, tools=[CONFIRM]),
    )  # fmt: skip
    # Then the same turn goes on under the new run: the result, the model's answer, its end
    events = [e for _, e in second]
    assert (events[0].type, events[0].run_id) == ("RUN_STARTED", "r-2")
    (result,) = [e for e in events if e.type == "TOOL_CALL_RESULT"]
    assert (result.tool_call_id, json.loads(result.content)) == (call.tool_call_id, {"confirmed": True})
    text = "".join(e.delta for e in events if e.type == "TEXT_MESSAGE_CONTENT")
    assert "confirmed" in text
    assert [e.type for e in events[-2:]] == ["STATE_SNAPSHOT", "RUN_FINISHED"]
    assert events[-2].snapshot["waiting_for"] == [] and events[-1].outcome is None
    async with httpx.AsyncClient(base_url=local.url, timeout=10) as http:
        turns = (await http.get("/v1/sessions/s-front/turns")).json()
        assert [t["status"] for t in turns] == ["completed"]  # one turn, run twice
        # And the same answer again answers nothing: refused, saying why
        again = await http.post(RUN, json=run_input("s-front", "r-3", ASKER, said, tools=[CONFIRM]))
        assert again.status_code == 409 and "answered already" in again.json()["error"]["message"]
    # And a frontend tool's interrupt the client cancels is a deny: the call fails, the turn goes on
    await read(
        local.url, RUN, until="RUN_FINISHED", method="POST",
        json=run_input("s-front-no", "r-1", ASKER, [USER], tools=[CONFIRM]),
    )  # fmt: skip
    gave_up = await read(
        local.url, RUN, until="RUN_FINISHED", method="POST",
        json=run_input("s-front-no", "r-2", ASKER, [], tools=[CONFIRM],
                       resume=[{"interruptId": call.tool_call_id, "status": "cancelled"}]),
    )  # fmt: skip
    (denied,) = [e for _, e in gave_up if e.type == "TOOL_CALL_RESULT"]
    assert "cancelled this call" in json.loads(denied.content)["error"]["message"]
    # And the first run sent again (a client that lost it) streams the same turn to the same stop
    replay = await read(
        local.url, RUN, until="RUN_FINISHED", method="POST",
        json=run_input("s-front", "r-1", ASKER, [USER], tools=[CONFIRM]),
    )  # fmt: skip
    assert types(replay) == types(first)


async def test_an_approval_is_answered_by_resume_entries_resolved_or_cancelled(local: LocalTendon) -> None:
    outcomes = {}
    for thread, entry in (
        ("s-yes", {"status": "resolved", "payload": True}),
        ("s-no", {"status": "cancelled"}),
    ):
        first = await read(
            local.url, RUN, until="RUN_FINISHED", method="POST",
            json=run_input(thread, "r-1", GUARDED, [{"id": "u", "role": "user", "content": "greet Ada"}]),
        )  # fmt: skip
        interrupt = first[-1][1].outcome.interrupts[0]
        assert interrupt.reason == "tool_approval" and interrupt.metadata == {
            "tool": "greet",
            "awaits": "approval",
        }
        resumed = await read(
            local.url, RUN, until="RUN_FINISHED", method="POST",
            json=run_input(thread, "r-2", GUARDED, [], resume=[{"interruptId": interrupt.id, **entry}]),
        )  # fmt: skip
        (result,) = [e for _, e in resumed if e.type == "TOOL_CALL_RESULT"]
        outcomes[thread] = json.loads(result.content)
    assert outcomes["s-yes"]["greeting"] == "Hello, Ada!"
    assert "error" in outcomes["s-no"]
    # A resume that is no answer to an approval is refused, naming what it takes
    await read(
        local.url, RUN, until="RUN_FINISHED", method="POST",
        json=run_input("s-odd", "r-1", GUARDED, [{"id": "u", "role": "user", "content": "greet Ada"}]),
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=local.url, timeout=10) as http:
        maybe = {"interruptId": "call-1", "status": "resolved", "payload": "maybe"}
        odd = await http.post(RUN, json=run_input("s-odd", "r-2", GUARDED, [], resume=[maybe]))
        assert odd.status_code == 422 and "approval" in odd.json()["error"]["message"]
        nothing = await http.post(RUN, json=run_input("s-odd", "r-3", GUARDED, []))
        assert nothing.status_code == 422
        # a frontend tool or an agent that is not one is refused, saying where, before anything runs
        user = [{"id": "u", "role": "user", "content": "hi"}]
        nameless = {"name": "", "description": "", "parameters": {}}
        bad_tool = await http.post(RUN, json=run_input("s-bad", "r-1", ASKER, user, tools=[nameless]))
        assert bad_tool.status_code == 422 and "tools[0].name" in bad_tool.json()["error"]["message"]
        bad_agent = await http.post(RUN, json=run_input("s-bad", "r-1", {"name": ""}, user))
        assert bad_agent.status_code == 422 and "forwardedProps.agent" in bad_agent.json()["error"]["message"]
        assert (await http.get("/v1/sessions/s-bad")).status_code == 404
