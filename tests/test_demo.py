"""The embedded demo as a newcomer runs it: real processes, a real SIGKILL, a rerun that resumes.

No PostgreSQL, RabbitMQ or S3 is touched: the demo keeps everything under --data-dir.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import re
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support import REPO, orphans_sql, run_cli

DEMO = ["-m", "brain", "demo"]
CUSTOMERS = [f"customer{i}@example.com" for i in range(1, 6)]

pytestmark = pytest.mark.chaos


def final_state(data_dir: Path) -> dict[str, object]:
    """What a rerun must always end with, read straight from the files."""
    mailbox = json.loads((data_dir / "mailbox.json").read_text())
    with sqlite3.connect(data_dir / "brain.sqlite3") as db:
        turns = db.execute("SELECT status FROM turns").fetchall()
        executions = db.execute("SELECT call_id, status FROM executions ORDER BY call_id").fetchall()
        orphans = [r for r in db.execute(orphans_sql("brain")).fetchall() if r[1]]
    with sqlite3.connect(data_dir / "hands.sqlite3") as db:
        orphans += [r for r in db.execute(orphans_sql("hands")).fetchall() if r[1]]
    return {
        "orphans": orphans,  # nothing checks foreign keys: the code keeps them
        "turns": turns,
        "executions": executions,
        "deliveries": sorted(d["to"] for d in mailbox["deliveries"]),
        "posts_per_key": sorted(mailbox["posts_per_key"].values()),
    }


EXPECTED = {
    "orphans": [],
    "turns": [("completed",)],
    "executions": [(f"call-{i}", "succeeded") for i in range(1, 6)],
    "deliveries": CUSTOMERS,
    "posts_per_key": [1, 1, 1, 1, 1],  # nothing was ever sent twice
}


async def test_a_crash_at_email_four_then_a_rerun_reuses_verifies_and_sends_the_rest(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    code, out, err = await run_cli([*DEMO, "--data-dir", str(data), "--crash-at", "4"], {})
    assert code == -signal.SIGKILL, out + err
    assert "will SIGKILL this process while email 4 is inside send_email" in out

    before_crash = out
    code, out, err = await run_cli([*DEMO, "--data-dir", str(data)], {})
    assert code == 0, out + err
    assert "resuming turn" in out and "3 of 5 emails already confirmed" in out
    # What was committed before the kill is shown exactly once: live if the timeline got to it
    # then, else after the restart ("committed before the crash, not shown then").
    for i in (1, 2, 3):
        line = f"email {i} to customer{i}@example.com: confirmed, sent"
        assert (before_crash + out).count(line) == 1, before_crash + out
    recap = out.split("what happened to each email:")[1]
    for i in (1, 2, 3):
        assert f"call-{i}  customer{i}@example.com    msg-{i}    reused" in recap
    assert "call-4  customer4@example.com    msg-4    the mail service had it" in recap
    assert "call-5  customer5@example.com    msg-5    sent" in recap
    assert final_state(data) == EXPECTED
    # The timeline says the fourth was asked about, not sent again, and which run of the turn
    # this is (the first ran before the crash)
    after = out.split("after the restart:")[-1]  # the header comes only after a catch-up
    assert "email 4 to customer4@example.com: asking the mail service about operation exe-" in after
    assert "email 4 to customer4@example.com: confirmed, the mail service had it" in after
    assert "sending (attempt" not in after.split("email 5")[0]
    claimed = next(line for line in after.splitlines() if "of the turn claimed it" in line)
    assert "run 1 " not in claimed


@pytest.mark.parametrize(
    "kill_at",
    [
        "brain.after_intent_commit@call-2",
        "hands.after_accept_commit@call-3",
        "hands.before_tool_body@call-1",
        "brain.after_update_received@succeeded",
        "hands.after_tool_body@call-5",
        "hands.before_event_publish@succeeded",
        "brain.after_apply_commit@succeeded",
    ],
)
async def test_a_data_dir_killed_at_any_point_ends_in_the_same_final_state(
    tmp_path: Path, kill_at: str
) -> None:
    data = tmp_path / "demo"
    code, out, err = await run_cli([*DEMO, "--data-dir", str(data)], {"TENDON_KILL_AT": kill_at})
    assert code == -signal.SIGKILL, out + err
    code, out, err = await run_cli([*DEMO, "--data-dir", str(data)], {})
    assert code == 0, out + err
    state = final_state(data)
    # A kill between the mail service counting a POST and accepting it may, rightly, lead to
    # one more POST of the same operation id; never to a second delivery.
    assert {**state, "posts_per_key": None} == {**EXPECTED, "posts_per_key": None}


async def test_fresh_starts_over_keeps_other_files_and_a_busy_data_dir_is_refused_clearly(
    tmp_path: Path,
) -> None:
    data = tmp_path / "demo"
    data.mkdir()
    (data / "notes.txt").write_text("mine")
    assert (await run_cli([*DEMO, "--data-dir", str(data)], {}))[0] == 0
    code, out, _ = await run_cli([*DEMO, "--data-dir", str(data)], {})
    assert code == 0 and "already completed; run with --fresh" in out
    code, out, _ = await run_cli([*DEMO, "--data-dir", str(data), "--fresh"], {})
    assert code == 0 and "resuming" not in out
    assert final_state(data) == EXPECTED  # a new turn, a new mailbox: still five, once each
    assert (data / "notes.txt").read_text() == "mine"

    held = os.open(data / "lock", os.O_RDWR)  # as if another demo were running on it
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, _, err = await run_cli([*DEMO, "--data-dir", str(data), "--fresh"], {})
    finally:
        os.close(held)
    assert code == 2
    assert f"another Tendon process is using {data}" in err


@pytest.mark.parametrize("after", [0.2, 0.5, 1.0])
async def test_ctrl_c_at_any_moment_ends_the_demo_with_one_line(tmp_path: Path, after: float) -> None:
    # Given a demo starting (still loading, opening its directory, or running)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *DEMO,
        "--data-dir",
        str(tmp_path / "demo"),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    # When Ctrl-C comes
    await asyncio.sleep(after)
    with contextlib.suppress(ProcessLookupError):  # it may have finished already
        proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), 60)

    # Then it stops with one line, never a traceback (or, done already, it says nothing); the
    # interpreter may still report the interrupt as SIGINT's exit status
    lines = err.decode().strip().splitlines()
    if lines:
        assert len(lines) == 1 and lines[0].startswith("brain: interrupted"), err
        assert proc.returncode in (130, -signal.SIGINT)
    else:
        assert proc.returncode in (0, -signal.SIGINT)


async def test_a_closed_output_ends_the_demo_with_one_line_not_a_data_directory_error(tmp_path: Path) -> None:
    # Given the demo piped into a reader that stops after three lines (`brain demo | head -3`)
    proc = await asyncio.create_subprocess_shell(
        f"{sys.executable} -m brain demo --data-dir {tmp_path / 'demo'} | head -3;"
        " echo ${PIPESTATUS[0]} >&2",
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        executable="/bin/bash",
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)

    # Then it stops saying why, with SIGPIPE's exit code, and the turn can be resumed
    assert len(out.decode().splitlines()) == 3
    assert err.decode().splitlines() == ["brain: stopped: the output was closed (broken pipe)", "141"]
    code, out_again, _ = await run_cli([*DEMO, "--data-dir", str(tmp_path / "demo")], {})
    assert code == 0 and final_state(tmp_path / "demo") == EXPECTED


def _story_model(body: dict) -> object:  # type: ignore[type-arg]
    """A chat model that tells the five-email story: list the customers, one email each, a summary."""
    from tests.chat_server import Reply, tool_results

    results = tool_results(body)
    if not results:
        return Reply(tool_calls=[("list_customers", "{}")], call_ids=["list"])
    customers = results[0]["result"]
    sent = [r for r in results[1:] if r["status"] == "succeeded"]
    if len(sent) < len(customers):
        c = customers[len(sent)]
        args = {
            "to": c["email"],
            "subject": "Service notice",
            "body": f"Dear {c['name']}, maintenance on Sunday.",
        }
        return Reply(tool_calls=[("send_email", json.dumps(args))], call_ids=[f"mail-{len(sent) + 1}"])
    return Reply(content="Sent: " + ", ".join(r["result"]["message_id"] for r in sent))


async def test_the_demo_told_by_a_chat_model_survives_a_crash_at_email_four(tmp_path: Path) -> None:
    from tests.chat_server import ChatServer

    data = tmp_path / "demo"
    with ChatServer(_story_model) as server:
        env = {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "test"}
        args = [*DEMO, "--model", "openai:story-model", "--data-dir", str(data)]
        code, out, err = await run_cli([*args, "--crash-at", "4"], env)
        assert code == -signal.SIGKILL, out + err
        assert "email 4 was accepted by the mail service, SIGKILL" in err
        code, out, err = await run_cli(args, env)
    assert code == 0, out + err
    assert "resuming turn" in out and "3 of 5 emails already confirmed" in out
    mailbox = json.loads((data / "mailbox.json").read_text())
    assert sorted(d["to"] for d in mailbox["deliveries"]) == CUSTOMERS
    assert sorted(mailbox["posts_per_key"].values()) == [
        1,
        1,
        1,
        1,
        1,
    ]  # the fourth was asked about, not resent
    assert "mailbox: 5 deliveries" in out and "Sent: msg-1, msg-2, msg-3, msg-4, msg-5" in out
    assert {r["model"] for r in server.requests} == {"story-model"}


async def test_ctrl_c_of_a_fresh_demo_says_how_to_resume_and_the_rerun_calls_it_an_interruption(
    tmp_path: Path,
) -> None:
    from tests.chat_server import ChatServer, tool_results

    asked, gate = threading.Event(), threading.Event()

    def held(body: dict) -> object:  # type: ignore[type-arg]
        # The model call after the second email waits for the test: the Ctrl-C lands mid-story.
        if len(tool_results(body)) == 3:
            asked.set()
            gate.wait(60)
        return _story_model(body)

    data = tmp_path / "demo"
    with ChatServer(held) as server:
        env = {**os.environ, "OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "test"}
        story = [*DEMO, "--model", "openai:story-model", "--data-dir", str(data)]
        # Given a --fresh run, interrupted (Ctrl-C) while the model is asked about the third email
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *story, "--fresh", cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        await asyncio.wait_for(asyncio.to_thread(asked.wait, 60), 60)
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        # Then it says how to go on: the same story without --fresh, which would start it over
        resume = f"brain demo --data-dir {data} --model openai:story-model"
        assert err.decode().strip() == f"brain: interrupted; `{resume}` resumes the story", err
        assert proc.returncode == 130
        # And that command resumes it, calling the stop an interruption, not a crash
        gate.set()
        code, out, err_again = await run_cli(story, env)
    assert code == 0, out + err_again
    assert "after it was interrupted: 2 of 5 emails already confirmed" in out
    assert "crash" not in out
    assert not (data / "interrupted").exists()


def _on_a_terminal(args: list[str]) -> tuple[int, str]:
    """Run the `brain` command with stdout and stderr on one terminal (a pty), as a person sees it."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=follower, stderr=follower)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal's other side closed: the process is gone
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    return proc.wait(timeout=60), seen.decode(errors="replace")


def test_the_progress_bar_is_erased_before_anything_else_is_written_on_its_terminal(tmp_path: Path) -> None:
    # Given the demo on a terminal, killed while email 4 is inside send_email (its last words on
    # stderr come while the bar is drawn on stdout)
    code, seen = _on_a_terminal([*DEMO, "--data-dir", str(tmp_path / "demo"), "--crash-at", "4"])
    assert code == -signal.SIGKILL, seen
    # Then nothing is ever written after the bar on its line: each drawing is erased first
    assert "emails confirmed" in seen
    assert re.search(r"emails confirmed(?!\r\x1b\[K)", seen) is None, seen
    assert "\r\x1b[Ktendon: kill point hands.after_tool_body@call-4 reached, SIGKILL" in seen


def test_log_lines_written_to_a_file_carry_no_colour_codes(tmp_path: Path) -> None:
    # Given the demo's log setup (readable lines) writing to a file, not a terminal
    script = (
        "from infra.process.logging import configure_logging, get_logger;"
        "configure_logging('console', 'WARNING'); get_logger('t').warning('something_odd', where='here')"
    )
    with open(tmp_path / "err.log", "w") as err:
        subprocess.run([sys.executable, "-c", script], cwd=REPO, stderr=err, check=True)
    # Then its line is plain text
    logged = (tmp_path / "err.log").read_text()
    assert "something_odd" in logged and "where=here" in logged
    assert "\x1b[" not in logged


async def test_the_demo_refuses_a_model_it_cannot_use_in_one_line() -> None:
    code, out, err = await run_cli([*DEMO, "--model", "gpt-4"], {})
    assert (
        code == 2
        and err.strip()
        == "brain: --model takes openai:NAME (a model of the API at OPENAI_BASE_URL), not 'gpt-4'"
    )
