"""The `brain` and `hands` commands on bad input, and when a service cannot be reached: one line on
stderr that names what is wrong (the id, the agent file, the service and its address, the
variable that is no setting) and the exit code `brain --help` documents (2: bad input; 5: a
service could not be reached; `hands` exits 2 for every error). Real processes.

The ids are refused as the HTTP API refuses them (``brain.rules.names``), with the same words,
whether a verb goes to the database or through a Brain's API (``--url``)."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest

from brain.face.commands import EXIT_UNAVAILABLE, EXIT_USAGE
from tests.support import REPO, Processes, TendonEnv, free_port, run_cli
from tests.test_console import local_server

AGENT = "examples/hello_agent.json"
# Nasty ids an argument can carry (a NUL cannot be in one), and the words that refuse each.
BAD_IDS = {
    "escape": ("a\x1bb", "holds a control character (U+001B) at character 2"),
    "newline": ("a\nb", "holds a control character (U+000A) at character 2"),
    "10k": ("x" * 10_000, "is 10,000 characters long: at most 200"),
}


def one_line(code: int, out: str, err: str, exit_code: int) -> str:
    """The one line of stderr of a command that failed with ``exit_code`` (and printed nothing)."""
    assert (code, out) == (exit_code, ""), (code, out, err[:2000])
    assert "Traceback" not in err, err[:4000]
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[:4000]
    return lines[0]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _cli(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    return await run_cli(["-m", "brain", *args], env)


GOOD = {"S": "s-cli", "R": "r-cli"}


@pytest.mark.parametrize("through", ["database", "api"])
async def test_bad_ids_are_one_line_and_exit_code_2_before_anything_is_reached(through: str) -> None:
    # Given a database, or a Brain's API, at a closed port: a verb that reached for it would say so
    port = _closed_port()
    env = (
        {"TENDON_DATABASE_URL": f"postgresql://t@127.0.0.1:{port}/t"}
        if through == "database"
        else {"TENDON_URL": f"http://127.0.0.1:{port}"}
    )
    submit = ["submit", "--session", "S", "--request-id", "R", "--agent", AGENT]
    verbs = [
        ("session id", [*submit, "go"], "S"),
        ("request id", [*submit, "go"], "R"),
        ("turn id", ["show", "TURN"], "TURN"),
        ("turn id", ["wait", "TURN"], "TURN"),
        ("call id", ["respond", "turn-1", "CALL", "--approve"], "CALL"),
        ("request id", ["steer", "turn-1", "slower", "--request-id", "R"], "R"),
        ("session id", ["threads", "S"], "S"),
    ]
    calls, expected = [], []
    nasty = list(BAD_IDS.values())
    for n, (what, args, spoil) in enumerate(verbs):
        # Every nasty id for the first verb, one each (in turn) for the others
        for value, words in nasty if n == 0 else [nasty[n % len(nasty)]]:
            calls.append([value if a == spoil else GOOD.get(a, a) for a in args])
            expected.append((what, words))
    calls.append(
        [GOOD.get(a, a) for a in submit] + ["--thread", "main\n", "go"]
    )  # a thread name: its own rule
    expected.append(("thread name", "is not valid: 1 to 64 letters"))
    # When each is run, Then each is refused in one line naming the id, exit code 2
    answers = await asyncio.gather(*(_cli(args, env) for args in calls))
    for (what, words), answer in zip(expected, answers, strict=True):
        line = one_line(*answer, EXIT_USAGE)
        assert line.startswith(f"brain: {what} "), line[:300]
        assert words in line and len(line) < 400, line[:300]


async def test_through_the_api_an_odd_id_is_sent_whole_and_a_refusal_is_one_line(
    processes: Processes, tmp_path: Path
) -> None:
    port = free_port()
    await local_server(processes, tmp_path, ["examples.hello_tools"], port)
    env = {"TENDON_URL": f"http://127.0.0.1:{port}"}
    # An id with a "?", a space or a superscript in it is one id (not found), never a query
    for odd in ("a?b=c", "a b", "²", "a#b"):
        line = one_line(*await _cli(["show", odd], env), EXIT_USAGE)
        assert line == f"brain: there is no turn {odd!r}", line
    # What the API refuses reaches the user as one line too: a version too long for a local
    # server, which adds its content's digest to it
    agent = json.loads(await asyncio.to_thread((REPO / AGENT).read_text))
    path = tmp_path / "long.json"
    await asyncio.to_thread(path.write_text, json.dumps({**agent, "version": "v" * 195}))
    args = ["submit", "--session", "s-long", "--request-id", "r1", "--agent", str(path), "go"]
    line = one_line(*await _cli(args, env), EXIT_USAGE)
    assert line.startswith("brain: agent hello version 'vvv") and "at most 187 characters" in line, line


@pytest.mark.parametrize(
    ("result", "words"),
    [
        ("NaN", "NaN is not valid JSON"),
        ("Infinity", "Infinity is not valid JSON"),
        ("1e999", "number 1e999 is out of range"),
        ('{"a": 1, "a": 2}', "duplicate JSON key 'a'"),
        ("18446744073709551616", "outside ±2^53-1"),
        ('{"a": ', "malformed JSON"),
    ],
)
async def test_a_respond_result_that_is_not_strict_json_is_one_line_and_exit_code_2(
    result: str, words: str
) -> None:
    env = {"TENDON_URL": f"http://127.0.0.1:{_closed_port()}"}  # never reached
    line = one_line(*await _cli(["respond", "turn-1", "call-1", "--result", result], env), EXIT_USAGE)
    assert line.startswith("brain: --result is not valid JSON: ") and words in line, line


async def test_a_reconcile_result_that_is_not_strict_json_is_one_line_naming_the_option() -> None:
    env = {"TENDON_HANDS_DATABASE_URL": f"postgresql://t@127.0.0.1:{_closed_port()}/t"}  # never reached
    for result, words in (("NaN", "NaN is not valid JSON"), ('{"a": 1, "a": 2}', "duplicate JSON key 'a'")):
        args = ["-m", "hands", "reconcile", "exec-1", "--result", result, "--evidence", "seen"]
        line = one_line(*await run_cli(args, env), 2)
        assert line == f"hands: --result is not valid JSON: {words}", line


# ---- agent files ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ('{"name": "a", "version": "1",', "is not strict JSON: malformed JSON: Expecting"),
        ('{"name": "a", "name": "b"}', "is not strict JSON: duplicate JSON key 'name'"),
        (
            '{"name": "a", "version": "1", "model": {"temperature": NaN}}',
            "is not strict JSON: NaN is not valid JSON",
        ),
        ("\xff", "is not strict JSON: body is not UTF-8"),
        (
            json.dumps({"name": "x" * 10_000, "version": "1", "model": {"kind": "scripted"}}),
            "invalid at name:",
        ),
        (json.dumps({"name": "a\x1bb", "version": "1", "model": {"kind": "scripted"}}), "invalid at name:"),
        (json.dumps({"name": "a", "version": "1\n", "model": {"kind": "scripted"}}), "invalid at version:"),
    ],
    ids=[
        "malformed",
        "duplicate key",
        "NaN",
        "not UTF-8",
        "10k name",
        "escape in name",
        "newline in version",
    ],
)
async def test_a_bad_agent_file_is_one_line_naming_the_file_with_exit_code_2(
    content: str, words: str, tmp_path: Path
) -> None:
    path = tmp_path / "agent.json"
    await asyncio.to_thread(
        path.write_bytes, content.encode("latin-1") if content == "\xff" else content.encode()
    )
    # No service is asked: the file is read first
    args = ["submit", "--session", "s", "--request-id", "r", "--agent", str(path), "go"]
    line = one_line(*await _cli(args, {"TENDON_DATABASE_URL": "postgresql://x@127.0.0.1:1/x"}), EXIT_USAGE)
    assert line.startswith(f"brain: agent definition {path} ") and words in line, line
    assert len(line) < 500, line[:600]


# ---- services that cannot be reached: which one, and where ------------------------------------


async def test_a_database_that_cannot_be_reached_is_named_with_its_address() -> None:
    port = _closed_port()
    for program, args, exit_code in (
        ("brain", ["show", "turn-1"], EXIT_UNAVAILABLE),
        ("hands", ["show", "exec-1"], 2),
    ):
        env = {"TENDON_DATABASE_URL": f"postgresql://tendon:secret@127.0.0.1:{port}/tendon"}
        line = one_line(*await run_cli(["-m", program, *args], env), exit_code)
        # (ConnectionRefusedError, unless another test took the port meanwhile)
        assert line.startswith(f"{program}: cannot reach PostgreSQL at 127.0.0.1:{port}: "), line
        assert "secret" not in line  # the address, never the credentials
    env = {"TENDON_DATABASE_URL": "postgresql://tendon@no-such-host.invalid:5432/tendon"}
    line = one_line(*await _cli(["show", "turn-1"], env), EXIT_UNAVAILABLE)
    assert line.startswith("brain: cannot reach PostgreSQL at no-such-host.invalid:5432: gaierror"), line


async def test_a_broker_and_an_http_address_that_cannot_be_had_are_named_with_their_addresses(
    tendon: TendonEnv,
) -> None:
    # Given the database, but a broker at a closed port (and no waiting for it)
    port = _closed_port()
    env = {
        **tendon.env,
        "TENDON_AMQP_URL": f"amqp://guest:guest@127.0.0.1:{port}/",
        "TENDON_SERVICE_WAIT_SECONDS": "0",
    }
    code, out, err = await _cli(["serve"], env)
    # (a server logs to stderr too: the last line is the command's)
    assert (code, out) == (EXIT_UNAVAILABLE, "") and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"brain: cannot reach RabbitMQ at 127.0.0.1:{port}: "), line
    # Given an HTTP address that is taken
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        code, out, err = await _cli(["serve", "--http", address], tendon.env)
    assert (code, out) == (EXIT_UNAVAILABLE, "") and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line == f"brain: cannot serve the HTTP API at {address}: Address already in use", line


# ---- TENDON_* variables that are no setting ---------------------------------------------------


async def test_a_tendon_variable_that_is_no_setting_is_warned_about_naming_the_one_meant() -> None:
    env = {
        "TENDON_CONCURENCY": "4",  # a typo
        "TENDON_FROBNICATE": "1",  # nothing like any setting
        "TENDON_MAILBOX_URL": "http://127.0.0.1:1",  # read by the example tools: not a typo
        "TENDON_TEST_WHATEVER": "1",  # the test suite's own
    }
    code, out, err = await _cli(["token", "acme"], env)
    assert code == 0 and out.strip(), err
    warnings = [line for line in err.splitlines() if "warning" in line]
    meant = "(did you mean TENDON_CONCURRENCY?)"
    assert warnings == [
        f"brain: warning: TENDON_CONCURENCY is not a Tendon setting {meant}: it is ignored",
        "brain: warning: TENDON_FROBNICATE is not a Tendon setting: it is ignored",
    ], err
    # hands says the same, and goes on to what it was asked
    port = _closed_port()
    code, _, err = await run_cli(
        ["-m", "hands", "show", "x"],
        {**env, "TENDON_HANDS_DATABASE_URL": f"postgresql://t@127.0.0.1:{port}/t"},
    )
    lines = err.strip().splitlines()
    assert code == 2 and lines[0].startswith("hands: warning: TENDON_CONCURENCY is not a Tendon setting"), err
    assert lines[-1].startswith(f"hands: cannot reach PostgreSQL at 127.0.0.1:{port}:"), err
