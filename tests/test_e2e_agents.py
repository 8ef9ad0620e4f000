"""Real agents end to end, with Brain and Hands processes: an OpenAI-compatible model (a local
chat-completions server in this test) that sees the tools, gets bad calls back as tool errors,
fails in the ways APIs fail; the retry budget across a Brain restart; the crash-loop limit;
threads of a session; and the five-email story told by that model with a Hands kill at email 4."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from examples.mailbox import MailboxServer
from tests.chat_server import ChatServer, Reply, Status, tool_results
from tests.support import Observer, Processes, TendonEnv, run_cli, wait_for

BRAIN = ["-m", "brain", "serve"]
HANDS_BULK = ["-m", "hands", "serve", "--route", "bulk", "--tools", "tests.brain_e2e_tools"]
HANDS_EMAIL = ["-m", "hands", "serve", "--route", "email", "--tools", "examples.email_tools"]
EXIT_CONFLICT, EXIT_USAGE = 4, 2

pytestmark = pytest.mark.chaos


def agent_file(tmp: Path, name: str, model: dict[str, Any], **fields: Any) -> str:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps({"name": name, "version": "1", "model": model, **fields}))
    return str(path)


async def submit(env: dict[str, str], agent: str, text: str = "go", session: str = "s", request: str = "r",
                 thread: str = "main") -> str:  # fmt: skip
    code, out, err = await run_cli(
        ["-m", "brain", "submit", "--session", session, "--request-id", request, "--thread", thread,
         "--agent", agent, text],
        env,
    )  # fmt: skip
    assert code == 0, err
    return out.strip()


@pytest.fixture
def bulk(tendon: TendonEnv) -> dict[str, str]:
    tendon.routes.add("bulk")
    return tendon.env


def openai_model(server: ChatServer, **extra: Any) -> dict[str, Any]:
    return {"kind": "openai", "name": "test-model", "base_url": server.url, "timeout": 10, **extra}


async def test_the_model_sees_the_tools_its_call_runs_and_its_result_goes_back_with_usage_recorded(
    tendon: TendonEnv, processes: Processes, tmp_path: Path, bulk: dict[str, str]
) -> None:
    def policy(body: dict[str, Any]) -> Any:
        if not tool_results(body):
            return Reply(tool_calls=[("slow_step", '{"seconds": 0.05, "label": "hi"}')], call_ids=["call_a"])
        return Reply(content="all done")

    with ChatServer(policy) as server:
        await processes.start_ready("brain", BRAIN, bulk)
        await processes.start_ready("hands", HANDS_BULK, bulk)
        agent = agent_file(
            tmp_path, "helper", openai_model(server), tools=["slow_step"], instructions="Be useful."
        )
        turn = await submit(bulk, agent, "say hi")
        obs = Observer(tendon)
        done = await obs.wait_turn(turn, "completed")
        first, second = server.requests
    assert done["result"] == {"text": "all done"}
    assert [t["function"]["name"] for t in first["tools"]] == ["slow_step"]
    assert first["messages"][:2] == [
        {"role": "system", "content": "Be useful."},
        {"role": "user", "content": "say hi"},
    ]
    (result,) = tool_results(second)
    assert result["tool_call_id"] == "call_a" and result["status"] == "succeeded"
    assert result["result"] == {"label": "hi", "slept": 0.05}
    # Usage and latency of each model call are in the journal, and `brain history` shows them
    replies = await obs.facts(turn, "turn.model_replied")
    assert [r["usage"]["total_tokens"] for r in replies] == [18, 18]
    assert [r["call"]["number"] for r in replies] == [1, 2] and all(
        r["call"]["latency_ms"] >= 0 for r in replies
    )
    code, out, err = await run_cli(["-m", "brain", "history", turn, "--json"], bulk)
    calls = json.loads(out)["model_calls"]
    assert code == 0 and [(c["number"], c["attempt"], c["status"]) for c in calls] == [
        (1, 1, "replied"),
        (2, 1, "replied"),
    ]


async def test_a_call_with_bad_arguments_goes_back_to_the_model_as_a_tool_error_and_the_turn_goes_on(
    tendon: TendonEnv, processes: Processes, tmp_path: Path, bulk: dict[str, str]
) -> None:
    def policy(body: dict[str, Any]) -> Any:
        results = tool_results(body)
        if not results:  # not JSON, and a wrong type, in one reply
            return Reply(tool_calls=[("slow_step", '{"seconds": '), ("slow_step", '{"seconds": "soon"}')])
        if len(results) == 2:
            return Reply(tool_calls=[("slow_step", '{"seconds": 0.01}')])
        return Reply(content="fixed it")

    with ChatServer(policy) as server:
        await processes.start_ready("brain", BRAIN, bulk)
        await processes.start_ready("hands", HANDS_BULK, bulk)
        turn = await submit(bulk, agent_file(tmp_path, "fixer", openai_model(server), tools=["slow_step"]))
        obs = Observer(tendon)
        await obs.wait_turn(turn, "completed")
        told = tool_results(server.requests[1])
    assert [r["status"] for r in told] == ["failed", "failed"]
    assert "not valid JSON" in told[0]["error"]["message"]
    assert "schema at seconds: 'soon' is not of type 'number'" in told[1]["error"]["message"]
    rows = await obs.executions(turn)
    assert [(r["status"], r["how"]) for r in rows] == [("failed", "rejected")] * 2 + [("succeeded", "ran")]


async def test_a_model_error_that_is_not_worth_retrying_fails_the_turn_at_once_with_the_reason(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    with ChatServer(lambda body: Status(400, message="model 'test-model' does not exist")) as server:
        await processes.start_ready("brain", BRAIN, tendon.env)
        turn = await submit(tendon.env, agent_file(tmp_path, "bad", openai_model(server)))
        failed = await Observer(tendon).wait_turn(turn, "failed")
        assert len(server.requests) == 1
    assert failed["error"]["code"] == "model_error"
    assert "answered 400" in failed["error"]["message"] and "does not exist" in failed["error"]["message"]


async def test_a_rate_limit_is_waited_out_as_long_as_the_api_asked_then_the_turn_goes_on(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    answers = iter([Status(429, {"Retry-After": "2"}), Reply(content="after the wait")])
    with ChatServer(lambda body: next(answers)) as server:
        await processes.start_ready("brain", BRAIN, tendon.env)
        turn = await submit(tendon.env, agent_file(tmp_path, "patient", openai_model(server)))
        obs = Observer(tendon)
        done = await obs.wait_turn(turn, "completed")
        assert len(server.requests) == 2
    assert done["result"] == {"text": "after the wait"} and done["retries"] == 1
    (retry,) = await obs.facts(turn, "turn.retry_scheduled")
    assert retry["in_seconds"] == 2.0 and "answered 429" in retry["error"]


async def test_the_retry_budget_survives_a_brain_restart_and_ends_the_turn_when_spent(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    retry = {"max_retries": 3, "initial": 0.3, "maximum": 0.6}
    with ChatServer(lambda body: Status(503)) as server:
        first = await processes.start_ready("brain", BRAIN, tendon.env)
        turn = await submit(tendon.env, agent_file(tmp_path, "flaky", openai_model(server), retry=retry))
        obs = Observer(tendon)

        async def retried_twice() -> bool:
            return len(await obs.facts(turn, "turn.retry_scheduled")) >= 2

        await wait_for(retried_twice, timeout=30, what="two retries")
        first.send_signal(signal.SIGKILL)
        assert await processes.wait_exit(first) == -signal.SIGKILL
        await processes.start_ready("brain", BRAIN, tendon.env)
        failed = await obs.wait_turn(turn, "failed", timeout=60)
        requests = len(server.requests)
    # Three retries in all, across both Brains: the budget was not reset by the restart
    assert failed["retries"] == 3 and failed["error"]["code"] == "limit_reached"
    assert (
        "gave up after 3 retries" in failed["error"]["message"]
        and "answered 503" in failed["error"]["message"]
    )
    assert len(await obs.facts(turn, "turn.retry_scheduled")) == 3
    lost = [f for f in await obs.facts(turn, "turn.run_lost") if f["phase"] == "model_request"]
    assert requests == 4 + len(lost)  # an attempt the killed Brain made but never recorded is LOST


async def test_a_turn_that_kills_its_brain_at_one_point_every_time_fails_after_the_crash_limit(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    agent = agent_file(
        tmp_path, "deadly", {"kind": "scripted", "script": [{"content": "never"}]}, limits={"max_crashes": 2}
    )
    doomed = {**tendon.env, "TENDON_KILL_AT": "brain.before_model_call@1"}
    turn = await submit(tendon.env, agent)
    for _ in range(2):  # each Brain that takes the turn dies before its model call
        brain = processes.start("brain", BRAIN, doomed)  # it may die before it says it is ready
        assert await processes.wait_exit(brain, timeout=30) == -signal.SIGKILL
    # The next Brain does not call the model a third time: it fails the turn, saying why
    survivor = await processes.start_ready("brain", BRAIN, doomed)
    failed = await Observer(tendon).wait_turn(turn, "failed", timeout=30)
    assert survivor.poll() is None
    assert failed["error"]["message"] == (
        "its Brain died 2 times in a row at phase model_request (model call 1); "
        "it is failed instead of being run again"
    )
    assert [f["how"] for f in await Observer(tendon).facts(turn, "turn.run_lost")] == ["died", "died"]


async def test_threads_of_a_session_run_in_parallel_each_pinned_and_closed_only_when_done(
    tendon: TendonEnv, processes: Processes, tmp_path: Path, bulk: dict[str, str]
) -> None:
    await processes.start_ready("brain", BRAIN, bulk)
    await processes.start_ready("hands", HANDS_BULK, bulk)
    # Each CLI call takes a second or two to start: the slow turns wait for the checks below.
    gate = tmp_path / "step"
    step = {"tool": "slow_step", "args": {"seconds": 0, "gate": str(gate)}}
    slow = {"kind": "scripted", "script": [{"tool_calls": [step]}, {"content": "slow done"}]}
    quick = {"kind": "scripted", "script": [{"content": "quick done"}]}
    a = agent_file(tmp_path, "slow", slow, tools=["slow_step"])
    b = agent_file(tmp_path, "quick", quick)
    obs = Observer(tendon)
    first = await submit(bulk, a, session="s", request="1", thread="research")
    second, other = await asyncio.gather(
        submit(bulk, a, session="s", request="2", thread="research"),  # after the first
        submit(bulk, b, session="s", request="3", thread="chat"),  # beside them
    )

    # The other thread's turn does not wait for the first thread's
    await obs.wait_turn(other, "completed")
    assert (await obs.turn(first))["status"] != "completed"
    assert (await obs.turn(second))["status"] == "queued"
    # A thread is pinned to the agent version it started with
    code, _, err = await run_cli(
        ["-m", "brain", "submit", "--session", "s", "--request-id", "4", "--thread", "research",
         "--agent", b, "x"],
        bulk,
    )  # fmt: skip
    assert (
        code == EXIT_CONFLICT and "thread 'research' of session 's' is pinned to agent slow version 1" in err
    )
    # Closing it with turns unfinished is refused; once they are done it closes and takes no more
    code, _, err = await run_cli(["-m", "brain", "close", "s", "--thread", "research"], bulk)
    assert code == EXIT_USAGE and "unfinished turn(s)" in err
    gate.touch()
    await obs.wait_turn(second, "completed")
    done = [await obs.turn(t) for t in (first, second)]
    assert done[0]["updated_at"] <= done[1]["updated_at"]
    code, out, err = await run_cli(["-m", "brain", "close", "s", "--thread", "research"], bulk)
    assert code == 0, err
    code, _, err = await run_cli(
        ["-m", "brain", "submit", "--session", "s", "--request-id", "5", "--thread", "research",
         "--agent", a, "x"],
        bulk,
    )  # fmt: skip
    assert code == EXIT_USAGE and "is closed" in err
    code, out, _ = await run_cli(["-m", "brain", "threads", "s", "--json"], bulk)
    threads = {t["name"]: t for t in json.loads(out)}
    assert threads["research"]["turns"] == 2 and threads["research"]["closed_at"] is not None
    assert threads["chat"]["closed_at"] is None and threads["chat"]["agent_name"] == "quick"


@pytest.fixture
def mailbox() -> Iterator[MailboxServer]:
    with MailboxServer(port=0) as server:
        yield server


CUSTOMERS = [f"customer{i}@example.com" for i in range(1, 6)]


def five_email_policy(body: dict[str, Any]) -> Any:
    """A model that sends the notice to each customer in turn, then sums up the receipts."""
    sent = [r for r in tool_results(body) if r.get("status") == "succeeded"]
    if len(sent) < 5:
        n = len(sent) + 1
        args = {
            "to": CUSTOMERS[n - 1],
            "subject": "Service notice",
            "body": f"Dear Customer {n}, maintenance.",
        }
        return Reply(tool_calls=[("send_email", json.dumps(args))], call_ids=[f"call-{n}"])
    return Reply(content="Sent: " + ", ".join(r["result"]["message_id"] for r in sent))


async def test_the_five_email_story_told_by_a_chat_model_survives_a_hands_kill_at_email_four(
    tendon: TendonEnv, processes: Processes, tmp_path: Path, mailbox: MailboxServer
) -> None:
    env = {**tendon.env, "TENDON_MAILBOX_URL": mailbox.url}
    with ChatServer(five_email_policy) as server:
        await processes.start_ready("brain", BRAIN, env)
        doomed = await processes.start_ready(
            "hands", HANDS_EMAIL, {**env, "TENDON_KILL_AT": "hands.after_tool_body@call-4"}
        )
        agent = agent_file(tmp_path, "notice", openai_model(server), tools=["send_email"])
        turn = await submit(env, agent, "Send the maintenance notice to our five customers")
        assert await processes.wait_exit(doomed) == -signal.SIGKILL
        await processes.start_ready("hands", HANDS_EMAIL, env)
        done = await Observer(tendon).wait_turn(turn, "completed", timeout=60)
    stats = mailbox.stats()
    assert sorted(d["to"] for d in stats["deliveries"]) == CUSTOMERS
    assert sorted(stats["posts_per_key"].values()) == [1, 1, 1, 1, 1]  # exactly five, none twice
    rows = await Observer(tendon).executions(turn)
    assert [r["how"] for r in rows] == ["ran", "ran", "ran", "verified_by_query", "ran"]
    assert done["result"]["text"] == "Sent: " + ", ".join(f"msg-{i}" for i in range(1, 6))


async def test_an_upgraded_pool_that_serves_both_versions_keeps_pinned_threads_and_gives_new_ones_the_new(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    tendon.routes.add("greet")
    env = tendon.env
    script = {"kind": "scripted", "script": [{"tool_calls": [{"tool": "greet", "args": {"who": "ann"}}]},
                                             {"content": "{results}"}]}  # fmt: skip
    agent = agent_file(tmp_path, "greeter", script, tools=["greet"])
    obs = Observer(tendon)
    await processes.start_ready("brain", BRAIN, env)
    old_pool = await processes.start_ready("hands", ["-m", "hands", "serve", "--route", "greet", "--tools",
                                                     "tests.greet_tools_v1"], env)  # fmt: skip
    first = await submit(env, agent, request="1", thread="old")
    assert '"version": 1' in (await obs.wait_turn(first, "completed"))["result"]["text"]

    # When the pool is upgraded to one that serves versions 1 and 2
    old_pool.terminate()
    assert await processes.wait_exit(old_pool) == 0
    await processes.start_ready("hands", ["-m", "hands", "serve", "--route", "greet", "--tools",
                                          "tests.greet_tools_v2"], env)  # fmt: skip

    async def announced_twice() -> bool:
        rows = await obs.fetch("SELECT count(*) AS n FROM {brain}.bindings WHERE name = 'greet'")
        return rows[0]["n"] == 2

    await wait_for(announced_twice, timeout=20, what="version 2 to be announced")
    # Then the thread pinned to version 1 goes on with it, and a new thread gets version 2
    again = await submit(env, agent, request="2", thread="old")
    fresh = await submit(env, agent, request="3", thread="new")
    assert '"version": 1' in (await obs.wait_turn(again, "completed"))["result"]["text"]
    assert '"version": 2' in (await obs.wait_turn(fresh, "completed"))["result"]["text"]
