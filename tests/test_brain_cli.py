"""`brain submit` as users run it: real processes, racing, on the local PostgreSQL and RabbitMQ."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from brain.face.commands import EXIT_UNAVAILABLE
from infra.transport import Topology
from infra.transport.broker import Broker
from tests.support import REPO, Observer, Processes, TendonEnv, free_port, run_cli, wait_for

AGENT = "examples/notice_agent.json"
BRAIN = ["-m", "brain", "serve"]
HANDS = ["-m", "hands", "serve", "--route", "email", "--tools", "examples.email_tools"]


async def _submit(
    env: dict[str, str], session: str, request_id: str, text: str, *options: str, agent: str = AGENT
) -> tuple[int, str, str]:
    return await run_cli(
        [
            "-m",
            "brain",
            "submit",
            "--session",
            session,
            "--request-id",
            request_id,
            "--agent",
            agent,
            *options,
            text,
        ],
        env,
    )


# The racing submits run without a pool: its tool is one a pool would announce later.
LATER = "--expect-tools"


@pytest.mark.parametrize("session_exists", [False, True])
async def test_racing_identical_submits_all_get_the_one_turn(tendon: TendonEnv, session_exists: bool) -> None:
    env = tendon.env
    if session_exists:
        code, _, err = await _submit(env, "s-race", "earlier", "an earlier turn", LATER)
        assert code == 0, err

    # When six identical submits arrive together
    answers = await asyncio.gather(
        *(_submit(env, "s-race", "same", "send the notice", LATER) for _ in range(6))
    )

    # Then every caller gets the one turn, and nobody sees a database error
    assert [code for code, _, _ in answers] == [0] * 6, [err for _, _, err in answers]
    assert len({out.strip() for _, out, _ in answers}) == 1
    rows = await Observer(tendon).fetch("SELECT id FROM {brain}.turns WHERE request_id = 'same'")
    assert [r["id"] for r in rows] == [answers[0][1].strip()]


async def test_racing_submits_with_other_input_get_a_conflict_with_its_own_exit_code(
    tendon: TendonEnv,
) -> None:
    env = tendon.env
    # When submits of one request id race with two different inputs
    texts = ["first input", "second input"] * 3
    answers = await asyncio.gather(*(_submit(env, "s-conflict", "r", text, LATER) for text in texts))

    # Then the turn is one input's; every caller with that input gets it, every other caller a
    # CONFLICT (exit code 4) that names the request id, and nothing else failed
    observer = Observer(tendon)
    (turn,) = await observer.fetch("SELECT id FROM {brain}.turns WHERE request_id = 'r'")
    (accepted,) = await observer.facts(turn["id"], "turn.accepted")
    won = accepted["input"]["text"]
    for text, (code, out, err) in zip(texts, answers, strict=True):
        if text == won:
            assert (code, out.strip()) == (0, turn["id"]), err
        else:
            assert code == 4 and out == "", err
            assert err.startswith("brain: CONFLICT:") and "'r'" in err and len(err.strip().splitlines()) == 1


async def test_submit_help_lists_the_exit_codes() -> None:
    code, out, _ = await run_cli(["-m", "brain", "submit", "--help"], {})
    assert code == 0
    assert "4  CONFLICT" in out and "5  a service" in out


async def test_submit_warns_when_no_pool_serves_a_tool_the_agent_names(
    tendon: TendonEnv, processes: Processes
) -> None:
    # Given no Hands pool at all, and a submit that expects one later
    code, out, err = await _submit(tendon.env, "s-lonely", "r1", "go", LATER)

    # Then the turn is accepted, and the caller is told what it will wait for
    assert code == 0 and out.strip().startswith("turn-")
    assert err.startswith("brain: warning: no Hands pool has announced send_email;")
    assert "TENDON_BINDING_WAIT_SECONDS" in err and len(err.strip().splitlines()) == 1

    # Given a pool that announced the tool to a Brain and then stopped
    obs = Observer(tendon)
    await processes.start_ready("brain", BRAIN, tendon.env)
    hands = await processes.start_ready("hands", HANDS, tendon.env)

    async def announced() -> bool:
        return bool(await obs.fetch("SELECT 1 FROM {brain}.bindings WHERE name = 'send_email'"))

    await wait_for(announced, what="the announcement")
    hands.send_signal(signal.SIGTERM)
    assert await processes.wait_exit(hands) == 0
    settings = tendon.settings()
    async with Broker(settings.amqp_url, Topology(settings.queue_prefix)) as broker:

        async def unserved() -> bool:  # a quorum queue forgets a consumer a moment later
            return await broker.consumers(broker.topology.commands("email")) == 0

        await wait_for(unserved, what="the broker to count no consumer")

    # Then the warning says that nobody serves its route right now (also to a client whose
    # settings differ from the servers' in what does not matter for looking)
    other_limit = {**tendon.env, "TENDON_DELIVERY_LIMIT": "9"}
    code, out, err = await _submit(other_limit, "s-lonely-2", "r2", "go")
    assert code == 0 and out.strip().startswith("turn-")
    assert err.startswith("brain: warning: no Hands pool serves route email (send_email) right now;"), err


async def test_text_the_database_cannot_store_is_bad_input_with_its_exit_code(
    tendon: TendonEnv, tmp_path: Path
) -> None:
    # Given an agent definition whose instructions hold a NUL (valid JSON: "\u0000")
    agent = json.loads(await asyncio.to_thread((REPO / AGENT).read_text))
    agent["instructions"] = "be\x00have"
    path = tmp_path / "agent.json"
    await asyncio.to_thread(path.write_text, json.dumps(agent))

    # When it is submitted, Then it is refused as bad input (exit 2), in one line, and nothing is written
    code, out, err = await run_cli(
        ["-m", "brain", "submit", "--session", "s-nul", "--request-id", "r", "--agent", str(path), "go"],
        tendon.env,
    )
    assert (code, out) == (2, "")
    assert err.startswith("brain: agent notice-sender cannot be stored: its text contains a NUL")
    assert len(err.strip().splitlines()) == 1
    assert await Observer(tendon).fetch("SELECT 1 FROM {brain}.turns") == []


@pytest.mark.parametrize("program", ["brain", "hands"])
@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("TENDON_CONCURRENCY", "0", "Input should be greater than or equal to 1"),
        ("TENDON_LOG_FORMAT", "yaml", "Input should be 'auto', 'json' or 'console'"),
    ],
)
async def test_a_bad_setting_is_one_line_naming_the_variable_with_exit_code_2(
    program: str, variable: str, value: str, said: str
) -> None:
    pool = ["--route", "r", "--tools", "examples.email_tools"] if program == "hands" else []
    args = ["-m", program, "serve", *pool]
    code, out, err = await run_cli(args, {variable: value})
    assert (code, out) == (2, "")
    assert err == f"{program}: bad setting {variable}: {said}\n"


async def test_a_brain_url_nobody_answers_is_one_line_with_the_unavailable_exit_code() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = await run_cli(["-m", "brain", "show", "t-1"], {"TENDON_URL": url})
    assert (code, out) == (EXIT_UNAVAILABLE, "")
    assert err.startswith(f"brain: cannot reach the Brain at {url}: ")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_the_verbs_start_without_the_server_in_their_process() -> None:
    # Each `brain submit`, `show` or control is a process of its own: the Brain server, the Hands
    # and the demo they would import for nothing cost an eighth of its start-up; the HTTP client
    # only serves the verbs given a URL.
    server = ("brain.app", "local.demo", "hands.app", "aiohttp", "httpx")
    loaded = f"import sys, brain.face.cli; print(sorted(m for m in {server!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", loaded], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
