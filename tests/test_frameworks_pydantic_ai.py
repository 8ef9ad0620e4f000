"""A Pydantic AI agent run durably on a Brain: real Brain and Hands processes on real services,
its model the framework's own OpenAI model against the local chat-completions server (which
counts every request: a replayed run must ask nothing it asked before).

Each run of a turn replays the agent's loop over the committed replies (brain.frameworks); the
tools are the Hands pools' ``@tool`` functions of the same names and schemas.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from examples.mailbox import MailboxServer
from tests.chat_server import ChatServer, Reply, Status, tool_results
from tests.support import Observer, Processes, TendonEnv, free_port, run_cli, wait_for

pytest.importorskip("pydantic_ai")

pytestmark = pytest.mark.chaos

BRAIN = ["-m", "brain", "serve"]
HANDS_EMAIL = ["-m", "hands", "serve", "--route", "email", "--tools", "examples.email_tools"]
HANDS_BULK = ["-m", "hands", "serve", "--route", "bulk", "--tools", "tests.brain_e2e_tools"]
MODULE = "tests.fw_pydantic_agents"


def definition(
    tmp: Path, name: str, tools: list[str], framework: str = "pydantic-ai", module: str = MODULE, **more: Any
) -> str:
    agent = {"name": f"{framework}-{name}", "version": "1", "framework": framework,
             "agent": f"{module}:{name}", "tools": tools, **more}  # fmt: skip
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(agent))
    return str(path)


def notice_policy(body: dict[str, Any]) -> Reply:
    """Five emails, one a reply, then the receipts."""
    done = tool_results(body)
    n = len(done)
    if n < 5:
        args = {"to": f"customer{n + 1}@example.com", "subject": "Service notice", "body": "Down on Sunday."}
        return Reply(tool_calls=[("send_email", json.dumps(args))], call_ids=[f"call-{n + 1}"])
    return Reply(content="Receipts: " + ", ".join(str(r.get("message_id")) for r in done))


@pytest.fixture
def mailbox() -> Iterator[MailboxServer]:
    with MailboxServer(port=0) as server:
        yield server


def model_env(tendon: TendonEnv, chat: ChatServer, **more: str) -> dict[str, str]:
    return {**tendon.env, "OPENAI_BASE_URL": chat.url, "OPENAI_API_KEY": "test", **more}


async def submit(env: dict[str, str], agent: str, text: str, session: str = "s-pa") -> str:
    """A turn of ``text`` in ``session`` (its request id made of both)."""
    request = f"r-{session}-{zlib.crc32(text.encode())}"
    code, out, err = await run_cli(
        ["-m", "brain", "submit", "--session", session, "--request-id", request, "--agent", agent, text], env
    )
    assert code == 0, err
    return out.strip()


def assert_ran_together(runs: Path) -> None:
    """Both one-second steps started before either finished: they ran at the same time."""
    said = [line.split()[:2] for line in runs.read_text().splitlines()]
    assert [w for _, w in said] == ["started", "started", "finished", "finished"], said


def assert_five_sent_once(mailbox: MailboxServer) -> None:
    stats = mailbox.stats()
    assert sorted(d["to"] for d in stats["deliveries"]) == sorted(
        f"customer{i}@example.com" for i in range(1, 6)
    )
    assert sorted(stats["posts_per_key"].values()) == [1, 1, 1, 1, 1]


async def test_the_five_email_story_sends_exactly_five_with_the_hands_killed_at_email_four(
    tendon: TendonEnv, processes: Processes, mailbox: MailboxServer, tmp_path: Path
) -> None:
    with ChatServer(notice_policy) as chat:
        env = model_env(tendon, chat, TENDON_MAILBOX_URL=mailbox.url)
        await processes.start_ready("brain", BRAIN, env)
        armed = {**env, "TENDON_KILL_AT": "hands.after_tool_body@call-4"}
        workers = [await processes.start_ready("hands", HANDS_EMAIL, armed) for _ in range(2)]
        turn_id = await submit(env, definition(tmp_path, "notice", ["send_email"]), "Send the notice")
        obs = Observer(tendon)
        turn = await obs.wait_turn(turn_id, "completed")

        assert sorted(w.poll() for w in workers if w.poll() is not None) == [-signal.SIGKILL]
        rows = await obs.executions(turn_id)
        assert [r["how"] for r in rows] == ["ran", "ran", "ran", "verified_by_query", "ran"]
        assert_five_sent_once(mailbox)
        for r in rows:
            assert r["result"]["message_id"] in turn["result"]["text"]
        # One model request per committed reply: the replays asked the model nothing again.
        assert len(chat.requests) == 6
        assert len(await obs.facts(turn_id, "turn.model_replied")) == 6


async def test_a_brain_killed_after_a_reply_and_after_an_intent_asks_nothing_twice_and_runs_nothing_twice(
    tendon: TendonEnv, processes: Processes, mailbox: MailboxServer, tmp_path: Path
) -> None:
    with ChatServer(notice_policy) as chat:
        env = model_env(tendon, chat, TENDON_MAILBOX_URL=mailbox.url)
        await processes.start_ready("hands", HANDS_EMAIL, env)
        # Dies once the 2nd reply (with its call) is committed, before its command is sent
        doomed = await processes.start_ready(
            "brain", BRAIN, {**env, "TENDON_KILL_AT": "brain.after_reply_commit@2"}
        )
        turn_id = await submit(env, definition(tmp_path, "notice", ["send_email"]), "Send the notice")
        assert await processes.wait_exit(doomed) == -signal.SIGKILL
        # then once the 4th intent is committed
        doomed = await processes.start_ready(
            "brain", BRAIN, {**env, "TENDON_KILL_AT": "brain.after_intent_commit@call-4"}
        )
        assert await processes.wait_exit(doomed) == -signal.SIGKILL
        await processes.start_ready("brain", BRAIN, env)
        obs = Observer(tendon)
        await obs.wait_turn(turn_id, "completed")

        assert_five_sent_once(mailbox)
        rows = await obs.executions(turn_id)
        assert [r["status"] for r in rows] == ["succeeded"] * 5
        ledger = await obs.ledger()
        assert sorted(r["execution_id"] for r in ledger) == sorted(r["id"] for r in rows)
        replies = await obs.facts(turn_id, "turn.model_replied")
        assert len(replies) == 6 and len(chat.requests) == 6  # never asked again for a committed reply
        runs = await obs.fetch("SELECT runs FROM {brain}.turns WHERE id = $1", turn_id)
        assert runs[0]["runs"] >= 3


async def test_two_one_second_tools_of_one_reply_run_in_parallel_and_a_local_tool_runs_in_the_brain(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    asked: list[float] = []

    def policy(body: dict[str, Any]) -> Reply:
        asked.append(time.monotonic())
        said = {m["tool_call_id"]: m["content"] for m in body["messages"] if m["role"] == "tool"}
        if not said:
            return Reply(
                tool_calls=[
                    ("slow_step", '{"seconds": 1, "label": "a"}'),
                    ("slow_step", '{"seconds": 1, "label": "b"}'),
                    ("shout", '{"text": "done"}'),
                ],
                call_ids=["c-a", "c-b", "c-s"],
            )
        labels = [json.loads(said[c])["label"] for c in ("c-a", "c-b")]
        return Reply(content=f"steps {' '.join(labels)}, {said['c-s']}")

    tendon.routes.add("bulk")
    with ChatServer(policy) as chat:
        env = model_env(tendon, chat, BULK_RUNS_FILE=str(tmp_path / "runs"))
        await processes.start_ready("brain", BRAIN, env)
        await processes.start_ready("hands", HANDS_BULK, env)
        agent = definition(tmp_path, "steps", ["slow_step"], local_tools=["shout"])
        turn_id = await submit(env, agent, "Do two steps")
        obs = Observer(tendon)
        turn = await obs.wait_turn(turn_id, "completed")

        assert turn["result"]["text"].startswith("steps a b")
        assert "DONE" in turn["result"]["text"]  # the local tool's answer, made in the Brain
        assert len(asked) == 2
        assert_ran_together(tmp_path / "runs")
        assert asked[1] - asked[0] >= 1.0  # (about 1.1 s on a quiet machine: not 2)
        rows = await obs.executions(turn_id)
        assert sorted(r["call_id"] for r in rows) == ["c-a", "c-b"]  # the local call is no execution


async def test_previews_of_the_frameworks_stream_reach_an_sse_subscriber_before_the_reply_commits(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    from tests.test_api_previews import events_until_completed

    answer = "A streamed answer, in pieces of eight characters, through the framework."

    def policy(body: dict[str, Any]) -> Reply:
        users = [m["content"] for m in body["messages"] if m["role"] == "user"]
        return Reply(content=answer, delay=2.0) if len(users) > 1 else Reply(content="warm")

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with ChatServer(policy) as chat:
        env = model_env(tendon, chat, TENDON_HTTP=f"127.0.0.1:{port}")
        await processes.start_ready("brain", BRAIN, env)
        agent = {"name": "pa-chatty", "version": "1", "framework": "pydantic-ai", "agent": f"{MODULE}:chatty"}
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            body = {"request_id": "r1", "input": "warm up", "agent": agent}
            first = (await http.post("/v1/sessions/s-prev/turns", json=body)).json()["turn_id"]
            assert (await http.get(f"/v1/turns/{first}", params={"wait": "30"})).json()[
                "status"
            ] == "completed"
            cursor = (await http.get(f"/v1/turns/{first}")).json().get("seq") or 0
            listening = asyncio.ensure_future(
                events_until_completed(url, "s-prev", int(cursor), previews=True, besides=first)
            )
            await asyncio.sleep(0.5)  # the subscriber is in (the model waits 2 s before its first byte)
            body = {"request_id": "r2", "input": "now the real question", "agent": agent}
            (await http.post("/v1/sessions/s-prev/turns", json=body)).raise_for_status()
            events = await asyncio.wait_for(listening, 30)

    kinds = [k for k, _ in events]
    replied = next(
        i for i, (k, d) in enumerate(events)
        if k == "entry"
        and any(f["kind"] == "turn.model_replied" and f["message"]["text"] == answer for f in d["facts"])
    )  # fmt: skip
    previews = [d for k, d in events[:replied] if k == "preview"]
    assert previews, kinds
    assert "".join(p["text"] for p in previews if p["kind"] == "text") == answer
    # the second turn's model saw the first turn (the thread's history, as the framework's messages)
    assert [m["content"] for m in chat.requests[-1]["messages"] if m["role"] == "user"] == [
        "warm up",
        "now the real question",
    ]


async def test_an_approval_in_the_frameworks_terms_waits_survives_a_brain_restart_and_respond_resumes_it(
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
            return (
                turn
                if turn and turn["status"] == "waiting" and "approval" in (turn["waiting_for"] or "")
                else None
            )

        await wait_for(waiting, timeout=30, what="the turn to wait for an approval")
        brain.send_signal(signal.SIGKILL)
        await processes.wait_exit(brain)
        await processes.start_ready("brain", BRAIN, env)
        assert (await obs.turn(turn_id))["status"] == "waiting" and mailbox.stats()["deliveries"] == []

        code, _, err = await run_cli(["-m", "brain", "respond", turn_id, "call-ok", "--approve"], env)
        assert code == 0, err
        turn = await obs.wait_turn(turn_id, "completed")
        assert len(mailbox.stats()["deliveries"]) == 1
        assert turn["result"]["text"].startswith("sent ")
        assert len(chat.requests) == 2


async def test_usage_of_every_model_call_an_output_retry_included_is_in_the_history(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    def policy(body: dict[str, Any]) -> Reply:
        if len(body["messages"]) <= 2:  # instructions and question: text, where a structured output is due
            return Reply(content="forty-two", usage={"prompt_tokens": 5, "completion_tokens": 3})
        return Reply(tool_calls=[("final_result", '{"value": 42, "unit": "kg"}')], call_ids=["out-1"],
                     usage={"prompt_tokens": 9, "completion_tokens": 4})  # fmt: skip

    with ChatServer(policy) as chat:
        env = model_env(tendon, chat)
        await processes.start_ready("brain", BRAIN, env)
        turn_id = await submit(env, definition(tmp_path, "measured", []), "How heavy?")
        obs = Observer(tendon)
        turn = await obs.wait_turn(turn_id, "completed")

    assert turn["result"]["output"] == {"value": 42, "unit": "kg"}
    replies = await obs.facts(turn_id, "turn.model_replied")
    assert [r["usage"]["total_tokens"] for r in replies] == [8, 13]
    code, out, err = await run_cli(["-m", "brain", "history", turn_id, "--json"], env)
    assert code == 0, err
    calls = json.loads(out)["model_calls"]
    assert [(c["number"], c["status"]) for c in calls] == [(1, "replied"), (2, "replied")]
    assert len(chat.requests) == 2


async def test_an_agent_that_asks_something_else_on_replay_fails_its_turn_naming_the_rule(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    def policy(body: dict[str, Any]) -> Reply:
        if not tool_results(body):
            return Reply(tool_calls=[("slow_step", '{"seconds": 0.01}')], call_ids=["call-d"])
        return Reply(content="done")

    tendon.routes.add("bulk")
    with ChatServer(policy) as chat:
        env = model_env(tendon, chat)
        await processes.start_ready("brain", BRAIN, env)
        await processes.start_ready("hands", HANDS_BULK, env)
        turn_id = await submit(env, definition(tmp_path, "drifting", ["slow_step"]), "Go")
        obs = Observer(tendon)
        with pytest.raises(AssertionError, match="turn ended failed") as failed:
            await obs.wait_turn(turn_id, "completed")

    turn = await obs.turn(turn_id)
    assert turn["error"]["code"] == "replay_diverged"
    assert "asked the model something different on replay at model call 1" in turn["error"]["message"]
    assert "deterministic between model calls" in turn["error"]["message"] and failed.value
    assert len(chat.requests) == 1  # the diverging run asked nothing


async def test_steer_pause_resume_and_cancel_act_on_a_framework_turn_at_its_model_call_boundaries(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"

    def policy(body: dict[str, Any]) -> Reply:
        done = len(tool_results(body))
        if body["messages"][-1].get("content") == "Wait forever":
            return Reply(
                tool_calls=[("slow_step", json.dumps({"seconds": 60, "gate": str(tmp_path / "never")}))]
            )
        if done == 0:  # the API numbers each reply's calls from 0: both are call_0
            return Reply(tool_calls=[("slow_step", json.dumps({"seconds": 60, "gate": str(gate)}))])
        if done == 1:
            return Reply(tool_calls=[("slow_step", '{"seconds": 0.01}')])
        return Reply(content="short")

    tendon.routes.add("bulk")
    with ChatServer(policy) as chat:
        env = model_env(tendon, chat)
        await processes.start_ready("brain", BRAIN, env)
        await processes.start_ready("hands", HANDS_BULK, env)
        agent = definition(tmp_path, "steps", ["slow_step"], local_tools=["shout"])
        turn_id = await submit(env, agent, "Do the steps")
        obs = Observer(tendon)
        await wait_for(lambda: _waiting(obs, turn_id), timeout=30, what="the turn to wait for its first step")
        code, _, err = await run_cli(["-m", "brain", "steer", turn_id, "keep it short"], env)
        assert code == 0, err
        code, _, err = await run_cli(["-m", "brain", "pause", turn_id], env)
        assert code == 0, err
        # paused: its tool's result is applied, but the framework's loop asks the model nothing
        await asyncio.to_thread(gate.touch)

        async def step_ended_while_paused() -> Any:
            turn = await obs.turn(turn_id)
            (execution,) = await obs.executions(turn_id)
            return turn if turn["status"] == "paused" and execution["status"] == "succeeded" else None

        paused = await wait_for(step_ended_while_paused, timeout=30, what="the step to end while paused")
        assert len(chat.requests) == 1
        code, _, err = await run_cli(
            ["-m", "brain", "resume", turn_id, "--revision", str(paused["revision"])], env
        )
        assert code == 0, err
        turn = await obs.wait_turn(turn_id, "completed")
        assert turn["result"]["text"] == "short"
        # the model's real requests after the steer carry it; the first one did not
        steered = [any(m.get("content") == "keep it short" for m in r["messages"]) for r in chat.requests]
        assert steered == [False, True, True]
        # a call id the API gave twice is told apart in the turn (each call got its own outcome)
        assert [r["call_id"] for r in await obs.executions(turn_id)] == ["call_0", "call-2"]

        other = await submit(env, agent, "Wait forever", session="s-cancel")
        await wait_for(lambda: _waiting(obs, other), timeout=30, what="the second turn to wait")
        code, _, err = await run_cli(["-m", "brain", "cancel", other], env)
        assert code == 0, err
        await obs.wait_turn(other, "cancelled")


async def _waiting(obs: Observer, turn_id: str) -> Any:
    turn = await obs.turn(turn_id)
    return turn if turn and turn["status"] == "waiting" else None


async def test_a_brain_killed_mid_stream_leaves_nothing_committed_and_the_next_run_asks_again(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    asked = threading.Event()
    release = threading.Event()

    def policy(body: dict[str, Any]) -> Reply:
        if not asked.is_set():
            asked.set()
            release.wait(20)  # the Brain dies while it waits for this reply's stream
            return Reply(content="lost with the Brain")
        return Reply(content="the committed answer")

    with ChatServer(policy) as chat:
        env = model_env(tendon, chat)
        brain = await processes.start_ready("brain", BRAIN, env)
        turn_id = await submit(env, definition(tmp_path, "chatty", []), "Hello")
        assert await asyncio.to_thread(asked.wait, 30)
        brain.send_signal(signal.SIGKILL)
        await processes.wait_exit(brain)
        release.set()
        obs = Observer(tendon)
        assert await obs.facts(turn_id, "turn.model_replied") == []
        await processes.start_ready("brain", BRAIN, env)
        turn = await obs.wait_turn(turn_id, "completed")

    assert turn["result"]["text"] == "the committed answer"
    (replied,) = await obs.facts(turn_id, "turn.model_replied")
    assert replied["message"]["text"] == "the committed answer" and len(chat.requests) == 2


async def test_a_failed_model_call_is_retried_by_the_turns_policy_and_a_denied_approval_reaches_the_model(
    tendon: TendonEnv, processes: Processes, mailbox: MailboxServer, tmp_path: Path
) -> None:
    overloaded = [True]  # the first request is answered 503

    def policy(body: dict[str, Any]) -> Any:
        last = body["messages"][-1]
        if last.get("content") == "Flaky" and overloaded:
            overloaded.clear()
            return Status(503, message="overloaded")
        if last.get("content") == "Send it":
            args = {"to": "boss@example.com", "subject": "Raise", "body": "Please."}
            return Reply(tool_calls=[("send_email", json.dumps(args))], call_ids=["call-no"])
        if last.get("role") == "tool":
            return Reply(content="told: " + last["content"])
        return Reply(content="fine", usage={"prompt_tokens": 3, "completion_tokens": 1})

    with ChatServer(policy) as chat:
        env = model_env(tendon, chat, TENDON_MAILBOX_URL=mailbox.url)
        await processes.start_ready("brain", BRAIN, env)
        await processes.start_ready("hands", HANDS_EMAIL, env)
        flaky = await submit(
            env, definition(tmp_path, "retrying", [], retry={"initial": 0.1}), "Flaky", "s-flaky"
        )
        obs = Observer(tendon)
        turn = await obs.wait_turn(flaky, "completed")
        assert turn["result"]["text"] == "fine"
        code, out, err = await run_cli(["-m", "brain", "history", flaky, "--json"], env)
        assert code == 0, err
        calls = [(c["number"], c["attempt"], c["status"]) for c in json.loads(out)["model_calls"]]
        assert calls == [(1, 1, "failed"), (1, 2, "replied")]

        denied = await submit(env, definition(tmp_path, "approved", ["send_email"]), "Send it", "s-deny")
        await wait_for(lambda: _waiting(obs, denied), timeout=30, what="the approval")
        code, _, err = await run_cli(
            ["-m", "brain", "respond", denied, "call-no", "--deny", "not today"], env
        )
        assert code == 0, err
        turn = await obs.wait_turn(denied, "completed")
        assert "not today" in turn["result"]["text"] and mailbox.stats()["deliveries"] == []


async def test_a_framework_tools_big_arguments_and_result_travel_through_s3_as_any_others(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    blob = "x" * 20_000  # over the threshold below: the command and the outcome go by reference

    def policy(body: dict[str, Any]) -> Reply:
        said = tool_results(body)
        if not said:
            return Reply(tool_calls=[("echo_blob", json.dumps({"blob": blob}))], call_ids=["call-b"])
        return Reply(content=f"echoed {said[0]['length']} {said[0]['blob'] == blob}")

    tendon.routes.add("bulk")
    with ChatServer(policy) as chat:
        env = model_env(tendon, chat, TENDON_OFFLOAD_THRESHOLD="4096")
        await processes.start_ready("brain", BRAIN, env)
        await processes.start_ready("hands", HANDS_BULK, env)
        turn_id = await submit(env, definition(tmp_path, "blobs", ["echo_blob"]), "Echo")
        obs = Observer(tendon)
        turn = await obs.wait_turn(turn_id, "completed")

    assert turn["result"]["text"] == "echoed 20000 True"
    assert len(chat.requests) == 2
    (execution,) = await obs.executions(turn_id)
    (succeeded,) = [e for e in await obs.hands_events(execution["id"]) if e["kind"] == "succeeded"]
    assert succeeded["body_ref"] is not None  # the result went through S3


async def test_a_model_call_failing_after_a_reply_of_the_same_run_is_retried_from_that_reply(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    answers: list[Any] = [
        Reply(content="forty-two"),  # committed, then the framework asks again (its output is due as a tool)
        Status(503, message="overloaded"),  # in the same run: retried from the turn as that reply left it
        Reply(tool_calls=[("final_result", '{"value": 42, "unit": "kg"}')], call_ids=["out-1"]),
    ]

    with ChatServer(lambda body: answers.pop(0)) as chat:
        env = model_env(tendon, chat)
        await processes.start_ready("brain", BRAIN, env)
        turn_id = await submit(
            env, definition(tmp_path, "measured_once", [], retry={"initial": 0.1}), "How heavy?"
        )
        turn = await Observer(tendon).wait_turn(turn_id, "completed", timeout=8)  # well within a lease

    assert turn["result"]["output"] == {"value": 42, "unit": "kg"} and len(chat.requests) == 3
    code, out, err = await run_cli(["-m", "brain", "history", turn_id, "--json"], env)
    assert code == 0, err
    calls = [(c["number"], c["attempt"], c["status"]) for c in json.loads(out)["model_calls"]]
    assert calls == [(1, 1, "replied"), (2, 1, "failed"), (2, 2, "replied")]
