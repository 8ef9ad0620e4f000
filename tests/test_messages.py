"""Honest messages: an assistant message has a logical id that every attempt of its model call
shares; an attempt that ends without a reply (a stream cut mid-way and retried, a Brain killed
mid-stream) is superseded in the journal, and the next one counts on. The stream, its previews,
the snapshot and AG-UI all say which attempt a text belongs to."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from brain.rules import moves
from brain.rules.messages import message_id, messages, next_message
from brain.rules.records import Entry, TurnRow
from brain.rules.states import TurnPhase, TurnStatus
from local.testing import LocalTendon, local_tendon
from tests.chat_server import ChatServer, Drop, Reply
from tests.support import Processes, TendonEnv, free_port
from tests.test_agui import EVENT
from tests.test_api import BRAIN

ANSWER = "The second attempt answers in full."
RETRY = {"max_retries": 3, "initial": 0.1, "multiplier": 1.0, "maximum": 0.1}


def agent(url: str, name: str = "honest") -> dict[str, Any]:
    model = {"kind": "openai", "name": "test-model", "base_url": url, "timeout": 10}
    return {"name": name, "version": "1", "model": model, "retry": RETRY}


async def stream_until_completed(
    url: str, session: str, got: list[tuple[str, dict[str, Any]]] | None = None, **params: str
) -> list[tuple[str, dict[str, Any]]]:
    """(event, data) of a session's stream (``pending``: it may not exist yet) until a turn completes."""
    got = [] if got is None else got
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(60, connect=10)) as http:
        async with http.stream("GET", f"/v1/sessions/{session}/stream", params=params) as response:
            assert response.status_code == 200
            kind = ""
            async for line in response.aiter_lines():
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    got.append((kind, json.loads(line[5:])))
                    if any(f["kind"] == "turn.completed" for f in got[-1][1].get("facts", ())):
                        return got
    raise AssertionError(f"the stream ended before the turn completed: {got}")


def facts_of(events: list[tuple[str, dict[str, Any]]], kind: str) -> list[dict[str, Any]]:
    return [f for k, d in events if k == "entry" for f in d["facts"] if f["kind"] == kind]


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalTendon]:
    async with local_tendon(tmp_path) as running:
        yield running


async def test_a_stream_cut_mid_reply_is_retried_as_attempt_two_of_the_same_message(
    local: LocalTendon,
) -> None:
    # Given a model whose first stream breaks after a few pieces, and that answers the second time
    answers = iter([Drop(content="Half a t"), Reply(content=ANSWER)])
    with ChatServer(lambda body: next(answers)) as chat:
        live = asyncio.create_task(
            stream_until_completed(local.url, "s-honest", previews="true", pending="true")
        )
        await asyncio.sleep(0.5)  # the subscriber listens before the first submit
        turn_id = await local.submit(agent(chat.url), "answer me", session="s-honest")
        seen = await asyncio.wait_for(live, 60)
        assert len(chat.requests) == 2

    mid = message_id(turn_id, 1)
    # Then the previews of both attempts carry the message's id and their attempt...
    pieces = [d for k, d in seen if k == "preview" and d["kind"] == "text"]
    assert {(p["message_id"], p["attempt"]) for p in pieces} == {(mid, 1), (mid, 2)}
    assert "".join(p["text"] for p in pieces if p["attempt"] == 1) == "Half a t"
    assert "".join(p["text"] for p in pieces if p["attempt"] == 2) == ANSWER
    # ...the first attempt is superseded, and one message completes: the second attempt
    superseded = facts_of(seen, "message.superseded")
    assert [(f["message_id"], f["attempt"]) for f in superseded] == [(mid, 1)]
    assert "asked again" in superseded[0]["why"]
    replied = facts_of(seen, "turn.model_replied")
    assert [(f["message_id"], f["attempt"], f["message"]["text"]) for f in replied] == [(mid, 2, ANSWER)]
    attempts = [p["attempt"] for p in pieces]
    assert attempts == sorted(attempts)  # the second attempt streams once the first is over

    # And the snapshot says the same of the turn
    async with httpx.AsyncClient(base_url=local.url, timeout=30) as http:
        snap = (await http.get("/v1/sessions/s-honest/snapshot")).json()
    said = snap["turns"][0]["messages"]
    assert said == [{"id": mid, "attempt": 2, "superseded": [1], "text": ANSWER, "tool_calls": []}]


async def test_ag_ui_ends_a_superseded_attempts_text_and_gives_the_next_attempt_its_own_id(
    local: LocalTendon,
) -> None:
    answers = iter([Drop(content="Half a t"), Reply(content=ANSWER)])
    with ChatServer(lambda body: next(answers)) as chat:
        turn_id = await local.submit(agent(chat.url), "answer me", session="s-agui-honest")
        await local.wait(turn_id)
    async with httpx.AsyncClient(base_url=local.url, timeout=30) as http:
        async with http.stream(
            "GET", "/v1/sessions/s-agui-honest/stream", params={"format": "ag-ui"}
        ) as response:
            events = []
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    events.append(EVENT.validate_json(line[5:]))
                    if events[-1].type.value == "RUN_FINISHED":
                        break
    mid = message_id(turn_id, 1)
    custom = [e.value for e in events if e.type.value == "CUSTOM" and e.name == "tendon.message.superseded"]
    assert [(c["message_id"], c["attempt"]) for c in custom] == [(mid, 1)]
    texts = [(e.message_id, e.delta) for e in events if e.type.value == "TEXT_MESSAGE_CONTENT"]
    assert texts == [(f"{mid}#2", ANSWER)]


async def test_a_brain_killed_mid_stream_leaves_attempt_one_superseded_and_attempt_two_completes(
    tendon: TendonEnv, processes: Processes
) -> None:
    # Given a served Brain whose model holds its first stream open after a few pieces
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    answers = iter([Drop(content="Half a t", hold=30.0), Reply(content=ANSWER)])
    env = {**tendon.env, "TENDON_HTTP": f"127.0.0.1:{port}"}
    with ChatServer(lambda body: next(answers)) as chat:
        first = await processes.start_ready("brain", BRAIN, env)
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            before: list[tuple[str, dict[str, Any]]] = []
            live = asyncio.create_task(
                stream_until_completed(url, "s-kill", before, previews="true", pending="true")
            )
            await asyncio.sleep(0.5)
            body = {"request_id": "r1", "input": "answer me", "agent": agent(chat.url)}
            turn_id = (await http.post("/v1/sessions/s-kill/turns", json=body)).json()["turn_id"]
            # When the Brain is killed while the first attempt's pieces are out
            for _ in range(100):
                if len(chat.requests) == 1:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)
            first.send_signal(signal.SIGKILL)
            with pytest.raises((httpx.HTTPError, AssertionError)):  # cut, or ended, with its Brain
                await asyncio.wait_for(live, 10)
            # Then a new Brain takes the turn over and makes the second attempt
            await processes.start_ready("brain2", BRAIN, env)
            done = (await http.get(f"/v1/turns/{turn_id}", params={"wait": "30"})).json()
            assert done["status"] == "completed"
            seen = await stream_until_completed(url, "s-kill")
            snap = (await http.get("/v1/sessions/s-kill/snapshot")).json()

    mid = message_id(turn_id, 1)
    shown = [(d["message_id"], d["attempt"], d["text"]) for k, d in before if k == "preview" and d["text"]]
    assert shown == [(mid, 1, "Half a t")]  # what the first attempt streamed before its Brain died
    lost = facts_of(seen, "message.superseded")
    assert [(f["message_id"], f["attempt"]) for f in lost] == [(mid, 1)]
    assert "the run was lost" in lost[0]["why"]
    replied = facts_of(seen, "turn.model_replied")
    assert [(f["message_id"], f["attempt"]) for f in replied] == [(mid, 2)]
    assert snap["turns"][0]["messages"][0] | {"text": None} == {
        "id": mid, "attempt": 2, "superseded": [1], "text": None, "tool_calls": [],
    }  # fmt: skip


def turn_row(**values: Any) -> TurnRow:
    fields: dict[str, Any] = dict(
        id="t1", namespace="n", session_id="s", thread_id="s", request_id="r", status=TurnStatus.RUNNING,
        phase=TurnPhase.MODEL_REQUEST, revision=3, lease_owner="b1", lease_epoch=2, waiting_for=None,
        model_calls=0, tool_step=0, retries=0, runs=2, result=None, error=None, created_at=datetime.now(UTC),
    )  # fmt: skip
    return TurnRow(**(fields | values))


def test_the_attempt_counts_on_until_a_reply_commits_and_starts_over_at_the_next_model_call() -> None:
    row = turn_row(status=TurnStatus.RUNNING, phase=TurnPhase.MODEL_REQUEST)
    # a failed model call that had begun supersedes its attempt; one that never asked does not
    failed = moves.retry(row, retries=1, delay=0.1, error="boom", asked=True)
    assert failed.model_attempt == 1
    assert failed.facts[-1] == {
        "kind": "message.superseded", "message_id": f"{row.id}/m1", "attempt": 1,
        "why": "the model call failed and is asked again: boom",
    }  # fmt: skip
    assert moves.retry(row, retries=1, delay=0.1, error="db away").model_attempt is None
    again = turn_row(status=TurnStatus.RUNNING, phase=TurnPhase.MODEL_REQUEST, model_attempt=1)
    assert next_message(again.id, again.model_calls, again.model_attempt) == (f"{row.id}/m1", 2)
    replied = moves.reply(again, {"text": "hi"}, {}, intents=None, first_look=1.0)
    assert replied.model_attempt == 0 and replied.model_calls == 1
    assert (replied.facts[0]["message_id"], replied.facts[0]["attempt"]) == (f"{row.id}/m1", 2)


def test_messages_fold_a_turns_attempts_and_leave_old_replies_without_ids_out() -> None:
    def entry(seq: int, *facts: dict[str, Any]) -> Entry:
        return Entry("s", seq, "s", "t1", None, None, None, list(facts), None)

    folded = messages(
        [
            entry(1, {"kind": "turn.model_replied", "message": {"text": "old"}, "usage": {}}),
            entry(2, {"kind": "message.superseded", "message_id": "t1/m2", "attempt": 1, "why": "x"}),
            entry(3, {"kind": "message.superseded", "message_id": "t1/m2", "attempt": 2, "why": "y"}),
        ]
    )
    assert folded == {"t1": [{"id": "t1/m2", "attempt": None, "superseded": [1, 2], "text": None,
                              "tool_calls": []}]}  # fmt: skip
