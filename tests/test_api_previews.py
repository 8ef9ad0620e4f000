"""Live previews over Server-Sent Events: a subscriber that asks for them sees a real model's
streamed pieces (the OpenAI-compatible adapter against the local chat-completions server) before
the committed reply; they are never stored, so a reader without previews, or one that resumes
from a cursor, sees only the journal."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests.chat_server import ChatServer, Reply
from tests.support import Processes, TendonEnv, free_port
from tests.test_api import BRAIN, HANDS_BULK

pytestmark = pytest.mark.chaos

ANSWER = "Hello there: this answer is streamed in pieces of eight characters."


async def events_until_completed(
    url: str, session: str, cursor: int, *, previews: bool, besides: str
) -> list[tuple[str, dict[str, Any]]]:
    """(event kind, data) of a session's stream from ``cursor`` until a turn other than
    ``besides`` completes."""
    got: list[tuple[str, dict[str, Any]]] = []
    params = {"cursor": str(cursor), "previews": str(previews).lower()}
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(30, connect=10)) as http:
        async with http.stream("GET", f"/v1/sessions/{session}/stream", params=params) as response:
            assert response.status_code == 200
            kind = ""
            async for line in response.aiter_lines():
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:") and kind in ("entry", "preview"):
                    data = json.loads(line[5:])
                    got.append((kind, data))
                    facts = [f["kind"] for f in data.get("facts", ())]
                    if data.get("turn_id") != besides and "turn.completed" in facts:
                        return got
    raise AssertionError(f"the stream ended before the turn completed: {got}")


def reply_text(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [
        f["message"]["text"]
        for kind, data in events
        if kind == "entry"
        for f in data["facts"]
        if f["kind"] == "turn.model_replied" and f["message"]["text"]
    ]


async def test_previews_reach_a_subscriber_that_asks_and_are_never_stored(
    tendon: TendonEnv, processes: Processes
) -> None:
    def policy(body: dict[str, Any]) -> Any:
        if body["messages"][-1]["role"] != "tool":  # each turn: a tool call, then the answer
            return Reply(tool_calls=[("slow_step", '{"seconds": 0.05, "label": "pre"}')], call_ids=["call_p"])
        return Reply(content=ANSWER)

    tendon.routes.add("bulk")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with ChatServer(policy) as chat:
        await processes.start_ready("brain", BRAIN, {**tendon.env, "TENDON_HTTP": f"127.0.0.1:{port}"})
        await processes.start_ready("hands", HANDS_BULK, tendon.env)
        model = {"kind": "openai", "name": "test-model", "base_url": chat.url, "timeout": 10}
        agent = {"name": "streamer", "version": "1", "tools": ["slow_step"], "model": model}
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            # The session exists once its first turn is accepted; a subscriber joins before the
            # second one is submitted.
            body = {"request_id": "r1", "input": "warm up", "agent": agent}
            first = (await http.post("/v1/sessions/s-prev/turns", json=body)).json()["turn_id"]
            assert (await http.get(f"/v1/turns/{first}", params={"wait": "30"})).json()[
                "status"
            ] == "completed"
            cursor = (await http.get("/v1/sessions/s-prev/snapshot")).json()["cursor"]
            live = asyncio.create_task(
                events_until_completed(url, "s-prev", cursor, previews=True, besides=first)
            )
            await asyncio.sleep(1.0)  # the stream is open
            body = {"request_id": "r2", "input": "again", "agent": agent}
            second = (await http.post("/v1/sessions/s-prev/turns", json=body)).json()["turn_id"]
            seen = await asyncio.wait_for(live, 60)
            # Read again from the same cursor, with and without asking for previews.
            again = await events_until_completed(url, "s-prev", cursor, previews=True, besides=first)
            plain = await events_until_completed(url, "s-prev", cursor, previews=False, besides=first)

    pieces = [data for kind, data in seen if kind == "preview"]
    assert pieces and {p["turn_id"] for p in pieces} == {second}
    text = "".join(p["text"] for p in pieces if p["kind"] == "text")
    assert text == ANSWER  # every piece of the streamed answer, in order
    arguments = "".join(p["text"] for p in pieces if p["kind"] == "tool_args")
    assert json.loads(arguments) == {"seconds": 0.05, "label": "pre"}
    # the pieces came before the committed reply, which is the truth
    committed_at = next(i for i, (kind, _) in enumerate(seen) if reply_text(seen[: i + 1]))
    assert all(kind == "entry" for kind, _ in seen[committed_at:])
    assert reply_text(seen) == [ANSWER]
    # never stored: a later reader gets the journal only, the same entries either way
    assert all(kind == "entry" for kind, _ in again + plain)
    assert again == plain == [(k, d) for k, d in seen if k == "entry"]
