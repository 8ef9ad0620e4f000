"""AG-UI: a session's stream as AG-UI events and AG-UI's run endpoint, on the embedded backend in
this process. Every event is validated by the ``ag-ui-protocol`` package's own models; a turn with
a tool call reads as AG-UI expects it (run started, a step with its tool call, the tool's result, a
step with the answer, run finished); a reader that resumes with Last-Event-ID gets the rest once;
a run request submits its turn once and streams it under the client's thread and run ids."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ag_ui.core import Event
from pydantic import TypeAdapter

from brain.api.agui_events import AguiEvents
from local.testing import LocalTendon, local_tendon
from tests.chat_server import ChatServer, Reply

EVENT: TypeAdapter[Any] = TypeAdapter(Event)
GREETER = {
    "name": "greeter", "version": "1", "tools": ["greet"],
    "model": {"kind": "scripted", "script": [
        {"tool_calls": [{"tool": "greet", "args": {"name": "Ada"}}]},
        {"content": "I greeted Ada."},
    ]},
}  # fmt: skip


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalTendon]:
    async with local_tendon(tmp_path, "examples.hello_tools") as running:
        yield running


async def read(
    url: str, path: str, *, until: str, method: str = "GET", headers: dict[str, str] | None = None, **kw: Any
) -> list[tuple[str | None, Any]]:
    """(SSE id, validated AG-UI event) of a stream, until an event of type ``until``."""
    got: list[tuple[str | None, Any]] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        async with http.stream(method, path, headers=headers, **kw) as response:
            assert response.status_code == 200, await response.aread()
            seen_id = None
            async for line in response.aiter_lines():
                if line.startswith("id:"):
                    seen_id = line[3:].strip()
                elif line.startswith("data:"):
                    event = EVENT.validate_json(line[5:])
                    got.append((seen_id, event))
                    seen_id = None
                    if event.type == until:
                        return got
    raise AssertionError(f"the stream ended before {until}: {got}")


def types(events: list[tuple[str | None, Any]]) -> list[str]:
    return [str(e.type.value) for _, e in events if e.type.value != "CUSTOM"]


async def test_a_turn_with_a_tool_call_reads_as_ag_ui_events_and_resumes_from_the_last_id(
    local: LocalTendon,
) -> None:
    # Given a turn that calls a tool and answers
    turn_id = await local.submit(GREETER, "greet Ada", session="s-agui")
    await local.wait(turn_id)

    # When its session is read as AG-UI events
    events = await read(
        local.url, "/v1/sessions/s-agui/stream", until="RUN_FINISHED", params={"format": "ag-ui"}
    )

    # Then they are AG-UI's own, in the order its clients expect
    assert types(events) == [
        "RUN_STARTED",
        "STEP_STARTED", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "STEP_FINISHED",
        "TOOL_CALL_RESULT",
        "STEP_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "STEP_FINISHED",
        "RUN_FINISHED",
    ]  # fmt: skip
    by_type = {str(e.type.value): e for _, e in events}
    assert by_type["RUN_STARTED"].run_id == turn_id
    assert json.loads(by_type["TOOL_CALL_ARGS"].delta) == {"name": "Ada"}
    assert json.loads(by_type["TOOL_CALL_RESULT"].content)["greeting"] == "Hello, Ada!"
    assert by_type["TEXT_MESSAGE_CONTENT"].delta == "I greeted Ada."
    # And Tendon's own facts come as custom events named after them
    assert {e.name for _, e in events if e.type.value == "CUSTOM"} >= {"tendon.execution.intended"}

    # And a reader that resumes from an id it saw gets every later event once, and no earlier one
    ids = [i for i, _ in events if i is not None]
    middle = ids[len(ids) // 2]
    cut = max(k for k, (i, _) in enumerate(events) if i == middle)
    rest = await read(
        local.url, "/v1/sessions/s-agui/stream", until="RUN_FINISHED", params={"format": "ag-ui"},
        headers={"Last-Event-ID": middle},
    )  # fmt: skip
    assert [e for _, e in rest] == [e for _, e in events[cut + 1 :]]


async def test_an_ag_ui_run_request_submits_its_turn_once_and_streams_it_under_the_clients_ids(
    local: LocalTendon,
) -> None:
    run = {
        "threadId": "s-run", "runId": "run-1", "state": {}, "tools": [], "context": [],
        "messages": [{"id": "m1", "role": "user", "content": "greet Ada"}],
        "forwardedProps": {"agent": GREETER},
    }  # fmt: skip
    first = await read(local.url, "/v1/agui/run", until="RUN_FINISHED", method="POST", json=run)
    started = next(e for _, e in first if e.type.value == "RUN_STARTED")
    assert (started.thread_id, started.run_id) == ("s-run", "run-1")
    assert "TEXT_MESSAGE_CONTENT" in types(first)
    # The same run again is the same turn: the same events, and no second turn in the session
    again = await read(local.url, "/v1/agui/run", until="RUN_FINISHED", method="POST", json=run)
    assert types(again) == types(first)
    assert len(await local.client.turns("s-run")) == 1


async def test_a_run_request_that_is_not_ag_uis_is_refused_in_the_apis_error_shape(
    local: LocalTendon,
) -> None:
    async with httpx.AsyncClient(base_url=local.url, timeout=30) as http:
        answer = await http.post("/v1/agui/run", json={"threadId": "s", "runId": "r", "messages": []})
    assert answer.status_code in (400, 422) and answer.json()["error"]["code"] == "schema_error"


def _reply_entry(seq: int, text: str) -> dict[str, Any]:
    fact = {"kind": "turn.model_replied", "message": {"text": text}, "usage": {}, "call": {"number": 1}}
    return {"seq": seq, "session_id": "s", "thread_id": "s", "turn_id": "t1", "facts": [fact]}


def test_previewed_text_is_not_sent_again_when_the_reply_commits() -> None:
    # Given a reply whose first pieces were previewed, then committed whole
    events = AguiEvents()
    live = events.preview({"turn_id": "t1", "kind": "text", "text": "Hello "})
    live += events.preview({"turn_id": "t1", "kind": "text", "text": "wor"})
    done = events.entry(_reply_entry(7, "Hello world."), {})
    said = [(e.type.value, getattr(e, "delta", None)) for e in live + done]
    # Then the text goes out once: the pieces, what they missed, then the end of the same message
    assert said == [
        ("TEXT_MESSAGE_START", None), ("TEXT_MESSAGE_CONTENT", "Hello "), ("TEXT_MESSAGE_CONTENT", "wor"),
        ("STEP_STARTED", None), ("TEXT_MESSAGE_CONTENT", "ld."), ("TEXT_MESSAGE_END", None),
        ("STEP_FINISHED", None),
    ]  # fmt: skip
    assert len({e.message_id for e in live + done if hasattr(e, "message_id")}) == 1
    # And previews that said something else (a re-asked call) are closed and said to be superseded
    events = AguiEvents()
    live = events.preview({"turn_id": "t1", "kind": "text", "text": "Bonjour"})
    done = events.entry(_reply_entry(8, "Hello."), {})
    kinds = [e.type.value for e in done]
    assert kinds[:3] == ["STEP_STARTED", "TEXT_MESSAGE_END", "CUSTOM"]
    assert [e.delta for e in done if e.type.value == "TEXT_MESSAGE_CONTENT"] == ["Hello."]


async def test_a_streamed_reply_reaches_an_ag_ui_run_in_pieces_and_its_text_comes_once(
    local: LocalTendon,
) -> None:
    # Given an agent on a model that streams its answer (eight characters a piece)
    answer = "Hello Ada, this answer is streamed in pieces of eight characters."
    with ChatServer(lambda body: Reply(content=answer)) as chat:
        agent = {"name": "talker", "version": "1", "tools": [],
                 "model": {"kind": "openai", "name": "m", "base_url": chat.url, "timeout": 10}}  # fmt: skip
        said = [{"id": "m1", "role": "user", "content": "hi"}]
        run = {"threadId": "s-live", "runId": "run-live", "state": {}, "tools": [], "context": [],
               "messages": said, "forwardedProps": {"agent": agent}}  # fmt: skip
        # When an AG-UI client runs it (the run's stream takes previews from before the submit)
        events = await read(local.url, "/v1/agui/run", until="RUN_FINISHED", method="POST", json=run)
    # Then the text came in pieces, as it was streamed, and the whole of it exactly once
    pieces = [e.delta for _, e in events if e.type.value == "TEXT_MESSAGE_CONTENT"]
    assert len(pieces) > 1 and "".join(pieces) == answer
    assert len({e.message_id for _, e in events if e.type.value == "TEXT_MESSAGE_START"}) == 1
