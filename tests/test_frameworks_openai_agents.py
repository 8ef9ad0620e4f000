"""An OpenAI Agents SDK agent run durably on a Brain: the same stories as the Pydantic AI one
(``tests/test_frameworks_pydantic_ai.py``), with the SDK's ``Runner`` loop replayed over the
committed replies and its chat-completions model against the local server."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from examples.mailbox import MailboxServer
from tests.chat_server import ChatServer, Reply, tool_results
from tests.support import Observer, Processes, TendonEnv, free_port, run_cli, wait_for
from tests.test_frameworks_pydantic_ai import (
    BRAIN,
    HANDS_BULK,
    HANDS_EMAIL,
    assert_five_sent_once,
    assert_ran_together,
    model_env,
    notice_policy,
    submit,
)
from tests.test_frameworks_pydantic_ai import definition as _definition

pytest.importorskip("agents")

pytestmark = pytest.mark.chaos

MODULE = "tests.fw_openai_agents"


@pytest.fixture
def mailbox() -> Iterator[MailboxServer]:
    with MailboxServer(port=0) as server:
        yield server


def definition(tmp: Path, name: str, tools: list[str], **more: Any) -> str:
    return _definition(tmp, name, tools, framework="openai-agents", module=MODULE, **more)


async def test_the_five_email_story_survives_the_hands_and_the_brain_killed_sending_exactly_five(
    tendon: TendonEnv,
    processes: Processes,
    mailbox: MailboxServer,
    tmp_path: Path,
) -> None:
    with ChatServer(notice_policy) as chat:
        env = model_env(tendon, chat, TENDON_MAILBOX_URL=mailbox.url)
        armed = {**env, "TENDON_KILL_AT": "hands.after_tool_body@call-4"}
        workers = [await processes.start_ready("hands", HANDS_EMAIL, armed) for _ in range(2)]
        doomed = await processes.start_ready(
            "brain", BRAIN, {**env, "TENDON_KILL_AT": "brain.after_reply_commit@2"}
        )
        turn_id = await submit(env, definition(tmp_path, "notice", ["send_email"]), "Send the notice")
        assert await processes.wait_exit(doomed) == -signal.SIGKILL
        doomed = await processes.start_ready(
            "brain", BRAIN, {**env, "TENDON_KILL_AT": "brain.after_intent_commit@call-3"}
        )
        assert await processes.wait_exit(doomed) == -signal.SIGKILL
        await processes.start_ready("brain", BRAIN, env)
        obs = Observer(tendon)
        turn = await obs.wait_turn(turn_id, "completed", timeout=90)

        assert_five_sent_once(mailbox)
        rows = await obs.executions(turn_id)
        assert [r["status"] for r in rows] == ["succeeded"] * 5
        assert sorted(w.poll() for w in workers if w.poll() is not None) == [-signal.SIGKILL]
        assert [r["how"] for r in rows] == ["ran", "ran", "ran", "verified_by_query", "ran"]
        for r in rows:
            assert r["result"]["message_id"] in turn["result"]["text"]
        assert len(chat.requests) == 6 == len(await obs.facts(turn_id, "turn.model_replied"))


async def test_two_one_second_tools_run_in_parallel_a_local_tool_in_the_brain_and_usage_is_kept(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    asked: list[float] = []

    def policy(body: dict[str, Any]) -> Reply:
        asked.append(time.monotonic())
        if body["messages"][-1].get("content") == "And again?":  # the thread's second turn
            return Reply(content="remembered")
        said = {m["tool_call_id"]: m["content"] for m in body["messages"] if m["role"] == "tool"}
        if not said:
            step = '{"seconds": 1, "label": "%s"}'
            calls = [("slow_step", step % "a"), ("slow_step", step % "b"), ("shout", '{"text": "done"}')]
            return Reply(
                tool_calls=calls,
                call_ids=["c-a", "c-b", "c-s"],
                usage={"prompt_tokens": 5, "completion_tokens": 2},
            )
        labels = [json.loads(said[c])["label"] for c in ("c-a", "c-b")]
        return Reply(content=f"steps {' '.join(labels)}, {said['c-s']}")

    tendon.routes.add("bulk")
    with ChatServer(policy) as chat:
        env = model_env(tendon, chat, BULK_RUNS_FILE=str(tmp_path / "runs"))
        await processes.start_ready("brain", BRAIN, env)
        await processes.start_ready("hands", HANDS_BULK, env)
        turn_id = await submit(
            env, definition(tmp_path, "steps", ["slow_step"], local_tools=["shout"]), "Steps"
        )
        obs = Observer(tendon)
        turn = await obs.wait_turn(turn_id, "completed")
        again = await submit(
            env, definition(tmp_path, "steps", ["slow_step"], local_tools=["shout"]), "And again?"
        )
        assert again != turn_id
        await obs.wait_turn(again, "completed")

    # the second turn's model saw the first: its Hands calls and their outputs (the local call left out)
    seen = chat.requests[-1]["messages"]
    assert [m["tool_call_id"] for m in seen if m["role"] == "tool"] == ["c-a", "c-b"]
    assert [c["id"] for m in seen if m["role"] == "assistant" for c in m.get("tool_calls") or []] == [
        "c-a",
        "c-b",
    ]
    assert [m["content"] for m in seen if m["role"] == "user"] == ["Steps", "And again?"]
    assert turn["result"]["text"] == "steps a b, DONE"
    assert_ran_together(tmp_path / "runs")
    assert asked[1] - asked[0] >= 1.0
    assert sorted(r["call_id"] for r in await obs.executions(turn_id)) == ["c-a", "c-b"]
    replies = await obs.facts(turn_id, "turn.model_replied")
    assert [r["usage"]["total_tokens"] for r in replies] == [7, 18]
    code, out, err = await run_cli(["-m", "brain", "history", turn_id, "--json"], env)
    assert code == 0, err
    assert [(c["number"], c["status"]) for c in json.loads(out)["model_calls"]] == [
        (1, "replied"),
        (2, "replied"),
    ]


async def test_a_needs_approval_tool_waits_survives_a_brain_restart_and_respond_resumes_it(
    tendon: TendonEnv, processes: Processes, mailbox: MailboxServer, tmp_path: Path
) -> None:
    def policy(body: dict[str, Any]) -> Reply:
        if not tool_results(body):
            args = {"to": "boss@example.com", "subject": "Raise", "body": "Please."}
            return Reply(tool_calls=[("send_email", json.dumps(args))], call_ids=["call-ok"])
        return Reply(content="sent " + str(tool_results(body)[0].get("message_id")))

    with ChatServer(policy) as chat:
        env = model_env(tendon, chat, TENDON_MAILBOX_URL=mailbox.url)
        brain = await processes.start_ready("brain", BRAIN, env)
        await processes.start_ready("hands", HANDS_EMAIL, env)
        turn_id = await submit(env, definition(tmp_path, "approved", ["send_email"]), "Ask for a raise")
        obs = Observer(tendon)

        async def waiting() -> Any:
            turn = await obs.turn(turn_id)
            return turn if turn and "approval" in (turn["waiting_for"] or "") else None

        await wait_for(waiting, timeout=30, what="the turn to wait for an approval")
        brain.send_signal(signal.SIGKILL)
        await processes.wait_exit(brain)
        await processes.start_ready("brain", BRAIN, env)
        assert (await obs.turn(turn_id))["status"] == "waiting" and mailbox.stats()["deliveries"] == []
        code, _, err = await run_cli(["-m", "brain", "respond", turn_id, "call-ok", "--approve"], env)
        assert code == 0, err
        turn = await obs.wait_turn(turn_id, "completed")

    assert len(mailbox.stats()["deliveries"]) == 1 and turn["result"]["text"].startswith("sent msg")
    assert len(chat.requests) == 2


async def test_previews_reach_an_sse_subscriber_before_the_commit_and_an_agent_breaking_the_replay_rule_fails(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    from tests.test_api_previews import events_until_completed

    answer = "A streamed answer, in pieces of eight characters, through the SDK."

    def policy(body: dict[str, Any]) -> Reply:
        if "run number" in str(body["messages"][0].get("content")):  # the drifting agent
            if not tool_results(body):
                return Reply(tool_calls=[("slow_step", '{"seconds": 0.01}')], call_ids=["call-d"])
            return Reply(content="done")
        users = [m for m in body["messages"] if m["role"] == "user"]
        return Reply(content=answer, delay=2.0) if len(users) > 1 else Reply(content="warm")

    tendon.routes.add("bulk")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with ChatServer(policy) as chat:
        env = model_env(tendon, chat, TENDON_HTTP=f"127.0.0.1:{port}")
        await processes.start_ready("brain", BRAIN, env)
        await processes.start_ready("hands", HANDS_BULK, env)
        agent = {
            "name": "oa-chatty",
            "version": "1",
            "framework": "openai-agents",
            "agent": f"{MODULE}:chatty",
        }
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            body = {"request_id": "r1", "input": "warm up", "agent": agent}
            first = (await http.post("/v1/sessions/s-prev/turns", json=body)).json()["turn_id"]
            assert (await http.get(f"/v1/turns/{first}", params={"wait": "30"})).json()[
                "status"
            ] == "completed"
            listening = asyncio.ensure_future(
                events_until_completed(url, "s-prev", 0, previews=True, besides=first)
            )
            await asyncio.sleep(0.5)  # the subscriber is in (the model waits 2 s before its first byte)
            body = {"request_id": "r2", "input": "now the real question", "agent": agent}
            (await http.post("/v1/sessions/s-prev/turns", json=body)).raise_for_status()
            events = await asyncio.wait_for(listening, 30)
        drifting = await submit(env, definition(tmp_path, "drifting", ["slow_step"]), "Go", session="s-drift")
        obs = Observer(tendon)
        with pytest.raises(AssertionError, match="turn ended failed"):
            await obs.wait_turn(drifting, "completed")

    replied = next(
        i for i, (k, d) in enumerate(events)
        if k == "entry"
        and any(f["kind"] == "turn.model_replied" and f["message"]["text"] == answer for f in d["facts"])
    )  # fmt: skip
    previews = [d for k, d in events[:replied] if k == "preview"]
    assert "".join(p["text"] for p in previews if p["kind"] == "text") == answer
    turn = await obs.turn(drifting)
    assert turn["error"]["code"] == "replay_diverged" and "model call 1" in turn["error"]["message"]
