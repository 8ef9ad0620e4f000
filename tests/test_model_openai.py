"""The OpenAI-compatible model adapter against a local chat-completions server: what it sends,
what it makes of replies (streamed or not), and how it classifies every way a call can fail."""

from __future__ import annotations

import asyncio
import email.utils
import json
from typing import Any

import pytest

from brain.models import Delta, Message, make_model
from brain.models.openai_chat import OpenAIModel, OpenAISpec, retry_after_seconds
from protocol import ModelError, SchemaError
from tests.chat_server import ChatServer, Drop, Malformed, Reply, Status

BINDING = {
    "name": "send_email",
    "version": "1",
    "route": "email",
    "description": "Send one email",
    "input_schema": {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]},
    "replay_policy": "unsafe",
    "digest": "d" * 64,
}
HISTORY = [
    Message(role="user", turn_id="t1", content={"text": "notify bob"}),
    Message(
        role="assistant",
        turn_id="t1",
        content={
            "text": None,
            "tool_calls": [{"call_id": "call_0", "tool": "send_email", "args": {"to": "bob"}}],
        },
    ),
    Message(
        role="tool",
        turn_id="t1",
        content={"call_id": "call_0", "status": "succeeded", "result": {"id": "m1"}, "error": None},
    ),
]


def model(server: ChatServer, **spec: Any) -> OpenAIModel:
    return OpenAIModel(OpenAISpec(name="test-model", base_url=server.url, timeout=5, **spec))


async def complete(
    m: OpenAIModel, deltas: list[Delta] | None = None, history: list[Message] = HISTORY
) -> Any:
    try:
        return await m.complete(
            instructions="Be brief.",
            history=history,
            turn_id="t1",
            tools=[BINDING],
            on_delta=deltas.append if deltas is not None else None,
        )
    finally:
        await m.close()


async def test_a_streamed_reply_is_assembled_its_pieces_previewed_and_its_usage_kept() -> None:
    with ChatServer(lambda body: Reply(content="All sent, receipt m1.")) as server:
        deltas: list[Delta] = []
        reply = await complete(model(server), deltas)
    assert reply.content == "All sent, receipt m1."
    assert reply.usage == {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    assert reply.model == "test-model" and reply.tool_calls == []
    assert "".join(d.text for d in deltas if d.kind == "text") == "All sent, receipt m1."
    # What went out: the conversation as chat messages, the binding's schema as a tool, a stream
    (body,) = server.requests
    assert body["stream"] is True and body["model"] == "test-model"
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool"]
    assert body["messages"][2]["tool_calls"][0]["function"] == {
        "name": "send_email",
        "arguments": '{"to": "bob"}',
    }
    assert body["messages"][3]["tool_call_id"] == "call_0"
    assert json.loads(body["messages"][3]["content"]) == {"status": "succeeded", "result": {"id": "m1"}}
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "send_email",
                "description": "Send one email",
                "parameters": BINDING["input_schema"],
            },
        }
    ]


async def test_pieces_of_a_burst_reach_the_event_loop_one_by_one_not_after_the_whole_reply() -> None:
    # Given a long reply whose chunks all arrive at once (a model faster than its reader)
    text = "word " * 2000
    with ChatServer(lambda body: Reply(content=text)) as server:
        deltas: list[Delta] = []
        seen: list[int] = []  # how many pieces were out each time another task got to run

        async def subscriber() -> None:
            while True:
                seen.append(len(deltas))
                await asyncio.sleep(0)

        watching = asyncio.create_task(subscriber())
        try:
            reply = await complete(model(server), deltas)
        finally:
            watching.cancel()
    # Then the loop ran other tasks (the streams passing pieces on) between the pieces, not only
    # when a read of the socket happened to wait: each piece could go out as it was parsed
    assert reply.content == text
    pieces = sum(1 for d in deltas if d.kind == "text")
    assert len(set(seen)) > pieces // 2, (pieces, len(set(seen)))


@pytest.mark.parametrize("stream", [True, False])
async def test_parallel_tool_calls_come_back_together_with_ids_unique_in_the_turn(stream: bool) -> None:
    # The server numbers every reply's calls from 0: call_0 was used in this turn already
    calls = [("send_email", '{"to": "ann"}'), ("send_email", '{"to": "cy"}')]
    with ChatServer(lambda body: Reply(tool_calls=calls)) as server:
        reply = await complete(model(server, stream=stream))
    assert [(c.tool, c.args, c.error) for c in reply.tool_calls] == [
        ("send_email", {"to": "ann"}, None),
        ("send_email", {"to": "cy"}, None),
    ]
    ids = [c.call_id for c in reply.tool_calls]
    assert len(set(ids)) == 2 and "call_0" not in ids


async def test_arguments_that_are_not_a_json_object_make_a_call_with_an_error_not_a_crash() -> None:
    calls = [("send_email", '{"to": "ann"'), ("send_email", "[1, 2]")]
    with ChatServer(lambda body: Reply(tool_calls=calls)) as server:
        reply = await complete(model(server))
    assert "not valid JSON" in (reply.tool_calls[0].error or "")
    assert reply.tool_calls[1].error == "the arguments must be a JSON object"


@pytest.mark.parametrize(
    ("answer", "retryable", "said"),
    [
        (Status(429, {"Retry-After": "7"}), True, "answered 429"),
        (Status(500), True, "answered 500"),
        (Status(503), True, "answered 503"),
        (Status(400, message="bad request: tools[0] is invalid"), False, "tools[0] is invalid"),
        (Status(401), False, "answered 401"),
        (Status(404), False, "answered 404"),
        (Malformed(), False, "malformed"),
    ],
)
@pytest.mark.parametrize("stream", [True, False])
async def test_failures_are_classified_retryable_or_not_with_the_reason(
    answer: Any, retryable: bool, said: str, stream: bool
) -> None:
    with ChatServer(lambda body: answer) as server:
        with pytest.raises(ModelError) as info:
            await complete(model(server, stream=stream))
    assert info.value.retryable is retryable
    assert said in info.value.message
    assert info.value.retry_after == (7.0 if isinstance(answer, Status) and answer.code == 429 else None)
    assert len(server.requests) == 1  # the client never retried on its own


async def test_a_stream_cut_short_is_a_retryable_lost_connection() -> None:
    with ChatServer(lambda body: Drop()) as server:
        deltas: list[Delta] = []
        with pytest.raises(ModelError) as info:
            await complete(model(server), deltas)
    assert info.value.retryable and "connection to the model API was lost" in info.value.message
    assert "".join(d.text for d in deltas) == "Let me t"  # what was previewed stays a preview


async def test_a_model_that_does_not_answer_in_time_is_a_retryable_timeout() -> None:
    with ChatServer(lambda body: Reply(content="late", delay=3)) as server:
        with pytest.raises(ModelError) as info:
            await complete(OpenAIModel(OpenAISpec(name="m", base_url=server.url, timeout=0.5)))
    assert info.value.retryable and "timed out" in info.value.message


async def test_a_refused_connection_is_a_retryable_connection_error() -> None:
    with ChatServer(lambda body: Reply()) as server:
        url = server.url
    with pytest.raises(ModelError) as info:
        await complete(OpenAIModel(OpenAISpec(name="m", base_url=url, timeout=2)))
    assert info.value.retryable and "connection" in info.value.message


def test_retry_after_is_read_as_seconds_milliseconds_or_a_date() -> None:
    assert retry_after_seconds({"Retry-After": "2.5"}) == 2.5
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    date = email.utils.formatdate(1_000_030, usegmt=True)
    assert retry_after_seconds({"Retry-After": date}, now=1_000_000) == 30
    assert retry_after_seconds({"Retry-After": "soon"}) is None
    assert retry_after_seconds({}) is None


def test_a_model_spec_that_names_an_unset_key_or_no_model_is_refused_clearly(monkeypatch: Any) -> None:
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    with pytest.raises(SchemaError, match="reads its API key from NO_SUCH_KEY, which is not set"):
        make_model({"kind": "openai", "name": "m", "api_key_env": "NO_SUCH_KEY"})
    with pytest.raises(SchemaError, match="openai model is invalid"):
        make_model({"kind": "openai"})
    with pytest.raises(SchemaError, match="supported: 'scripted', 'openai'"):
        make_model({"kind": "gpt"})
