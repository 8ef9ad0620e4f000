"""The example mailbox (the "external system") and the email tools that talk to it."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from examples.email_tools import (
    CUSTOMERS,
    MailboxError,
    find_sent_email,
    list_customers,
    send_email,
)
from examples.mailbox import MailboxServer
from hands.tools.declare import Found, NotFound, ToolContext
from protocol import ReplayPolicy

REPO_ROOT = Path(__file__).resolve().parents[1]
MESSAGE = {"to": "customer4@example.com", "subject": "Notice", "body": "Hello"}


def http(
    method: str, url: str, payload: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    data = payload if isinstance(payload, bytes) else None
    if payload is not None and data is None:
        data = json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def post(url: str, key: str | None, payload: Any = MESSAGE) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return http("POST", f"{url}/messages", payload, headers)


@pytest.fixture
def mailbox() -> Iterator[MailboxServer]:
    server = MailboxServer("127.0.0.1", 0).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def blind_mailbox() -> Iterator[MailboxServer]:
    server = MailboxServer("127.0.0.1", 0, lookup=False).start()
    try:
        yield server
    finally:
        server.stop()


class RecordingOutput:
    def __init__(self, server: MailboxServer) -> None:
        self.server = server
        self.writes: list[tuple[str, int]] = []

    async def write(self, data: str) -> None:
        posts = sum(self.server.stats()["posts_per_key"].values())
        self.writes.append((data, posts))


class MailboxProcess:
    """``python -m examples.mailbox`` as a real subprocess, ended by its PID."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "examples.mailbox", "--port", "0", *args],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url = self._wait_ready(timeout=15.0)

    def _wait_ready(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.stop()
                raise AssertionError("mailbox subprocess did not print its ready line in time")
            ready, _, _ = select.select([self.proc.stdout], [], [], remaining)
            if not ready:
                continue
            line = self.proc.stdout.readline()
            if not line:
                err = self.stop()
                raise AssertionError(f"mailbox subprocess exited before ready: {err}")
            prefix = "mailbox listening on "
            if line.startswith(prefix):
                return line[len(prefix) :].strip()

    def stop(self) -> str:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, 15)  # SIGTERM, by PID
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, 9)
                self.proc.wait(timeout=10)
        _, err = self.proc.communicate(timeout=10)
        return err


# --- the mailbox service -----------------------------------------------------------------


def test_a_second_post_with_the_same_key_returns_the_same_receipt_without_a_new_delivery(
    mailbox: MailboxServer,
) -> None:
    status1, receipt1 = post(mailbox.url, "op-1")
    status2, receipt2 = post(mailbox.url, "op-1")

    assert status1 == 201
    assert status2 == 200
    assert receipt1 == receipt2
    assert receipt1["message_id"] == "msg-1"
    assert receipt1["idempotency_key"] == "op-1"
    assert receipt1["to"] == MESSAGE["to"]
    assert receipt1["accepted_at"]
    status, stats = http("GET", f"{mailbox.url}/stats")
    assert status == 200
    assert stats == {"deliveries": [receipt1], "posts_per_key": {"op-1": 2}}


def test_different_keys_make_different_deliveries_in_order(mailbox: MailboxServer) -> None:
    _, first = post(mailbox.url, "op-a")
    _, second = post(mailbox.url, "op-b")

    assert (first["message_id"], second["message_id"]) == ("msg-1", "msg-2")
    assert mailbox.stats()["deliveries"] == [first, second]


def test_a_post_without_an_idempotency_key_is_rejected(mailbox: MailboxServer) -> None:
    status, answer = post(mailbox.url, None)

    assert status == 400
    assert "Idempotency-Key" in answer["error"]
    assert mailbox.stats() == {"deliveries": [], "posts_per_key": {}}


@pytest.mark.parametrize(
    "payload",
    [b"{not json", [1, 2], {"to": "a@example.com", "subject": "s"}, {**MESSAGE, "to": 3}],
    ids=["bad-json", "not-an-object", "missing-body", "non-string-to"],
)
def test_a_post_with_a_bad_body_is_rejected_but_still_counted(mailbox: MailboxServer, payload: Any) -> None:
    status, answer = post(mailbox.url, "op-bad", payload)

    assert status == 400
    assert answer["error"]
    assert mailbox.stats() == {"deliveries": [], "posts_per_key": {"op-bad": 1}}


def test_lookup_by_key_finds_an_accepted_message_and_not_an_unknown_one(
    mailbox: MailboxServer,
) -> None:
    _, receipt = post(mailbox.url, "op-1")

    assert http("GET", f"{mailbox.url}/messages/by-key/op-1") == (200, receipt)
    assert http("GET", f"{mailbox.url}/messages/by-key/op-2") == (404, {"error": "not found"})


def test_a_mailbox_without_lookup_answers_503_to_lookups_but_still_accepts_messages(
    blind_mailbox: MailboxServer,
) -> None:
    status, _ = post(blind_mailbox.url, "op-1")

    assert status == 201
    assert http("GET", f"{blind_mailbox.url}/messages/by-key/op-1") == (
        503,
        {"error": "lookup not supported"},
    )


def test_a_slow_mailbox_has_the_message_before_it_answers_its_post() -> None:
    with MailboxServer("127.0.0.1", 0, delay=1.0) as slow:
        with pytest.raises(TimeoutError):  # a sender that gives up (or dies) while it waits...
            http_timeout = urllib.request.Request(
                f"{slow.url}/messages", json.dumps(MESSAGE).encode(), {"Idempotency-Key": "op-1"}
            )
            urllib.request.urlopen(http_timeout, timeout=0.3)
        # ...left a message the mailbox has: asking by its key finds it
        assert http("GET", f"{slow.url}/messages/by-key/op-1")[0] == 200


def test_the_state_file_survives_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "mailbox.json"
    with MailboxServer("127.0.0.1", 0, state_path=state) as first:
        _, receipt = post(first.url, "op-1")
        post(first.url, "op-1")
    assert json.loads(state.read_text())["deliveries"] == [receipt]

    with MailboxServer("127.0.0.1", 0, state_path=state) as second:
        assert http("GET", f"{second.url}/messages/by-key/op-1") == (200, receipt)
        status, again = post(second.url, "op-1")
        _, other = post(second.url, "op-2")
        assert (status, again) == (200, receipt)
        assert other["message_id"] == "msg-2"
        assert second.stats()["posts_per_key"] == {"op-1": 3, "op-2": 1}
    assert not [p for p in tmp_path.iterdir() if p.name != "mailbox.json"]  # no temp leftovers


def test_the_command_line_mailbox_prints_its_port_and_keeps_state_across_a_restart(
    tmp_path: Path,
) -> None:
    state = str(tmp_path / "state.json")
    first = MailboxProcess("--state", state)
    try:
        assert first.url.startswith("http://127.0.0.1:")
        assert not first.url.endswith(":0")
        status, receipt = post(first.url, "op-1")
        assert status == 201
    finally:
        first.stop()
    assert first.proc.returncode is not None

    second = MailboxProcess("--state", state, "--no-lookup")
    try:
        status, again = post(second.url, "op-1")
        assert (status, again) == (200, receipt)
        assert http("GET", f"{second.url}/stats")[1]["posts_per_key"] == {"op-1": 2}
        assert http("GET", f"{second.url}/messages/by-key/op-1")[0] == 503
    finally:
        second.stop()


# --- the email tools ----------------------------------------------------------------------


def test_the_tools_are_declared_for_the_email_route_with_the_right_replay_policies() -> None:
    assert send_email.binding.route == "email"
    assert send_email.binding.version == "1"
    assert send_email.binding.replay_policy == ReplayPolicy.UNSAFE
    assert send_email.binding.has_query
    assert send_email.query is find_sent_email
    assert list_customers.binding.route == "email"
    assert list_customers.binding.replay_policy == ReplayPolicy.SAFE
    assert list_customers.query is None


async def test_send_email_then_find_sent_email_finds_the_same_receipt(
    mailbox: MailboxServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENDON_MAILBOX_URL", mailbox.url)
    output = RecordingOutput(mailbox)
    ctx = ToolContext(operation_id="op-1", output=output)

    receipt = await send_email.fn(ctx, **MESSAGE)
    found = await find_sent_email(ToolContext(operation_id="op-1"), **MESSAGE)

    assert receipt["idempotency_key"] == "op-1"
    assert found == Found(receipt)
    assert len(output.writes) == 1
    line, posts_before = output.writes[0]
    assert "op-1" in line and posts_before == 0  # written before anything was sent
    assert mailbox.stats()["posts_per_key"] == {"op-1": 1}  # the query did not post


async def test_sending_again_with_the_same_operation_id_delivers_only_once(
    mailbox: MailboxServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENDON_MAILBOX_URL", mailbox.url)

    first = await send_email.fn(ToolContext(operation_id="op-1"), **MESSAGE)
    second = await send_email.fn(ToolContext(operation_id="op-1", attempt=2), **MESSAGE)

    assert first == second
    assert len(mailbox.stats()["deliveries"]) == 1


async def test_find_sent_email_for_an_unknown_operation_returns_not_found(
    mailbox: MailboxServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENDON_MAILBOX_URL", mailbox.url)
    await send_email.fn(ToolContext(operation_id="op-1"), **MESSAGE)

    assert await find_sent_email(ToolContext(operation_id="op-2"), **MESSAGE) == NotFound()


async def test_find_sent_email_raises_when_the_mailbox_cannot_be_queried(
    blind_mailbox: MailboxServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENDON_MAILBOX_URL", blind_mailbox.url)
    await send_email.fn(ToolContext(operation_id="op-1"), **MESSAGE)

    with pytest.raises(MailboxError, match="503.*lookup not supported"):
        await find_sent_email(ToolContext(operation_id="op-1"), **MESSAGE)


async def test_find_sent_email_raises_when_the_mailbox_is_unreachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = MailboxServer("127.0.0.1", 0).start()
    url = server.url
    server.stop()  # nothing listens on that port any more
    monkeypatch.setenv("TENDON_MAILBOX_URL", url)

    with pytest.raises(MailboxError, match="unreachable"):
        await find_sent_email(ToolContext(operation_id="op-1"), **MESSAGE)


async def test_the_mailbox_url_is_read_when_the_tool_runs_not_at_import(
    mailbox: MailboxServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENDON_MAILBOX_URL", mailbox.url + "/")

    await send_email.fn(ToolContext(operation_id="op-late"), **MESSAGE)

    assert mailbox.stats()["posts_per_key"] == {"op-late": 1}


async def test_list_customers_returns_five_fixed_customers() -> None:
    customers = await list_customers.fn(ToolContext(operation_id="op-list"))

    assert customers == [{"name": f"Customer {n}", "email": f"customer{n}@example.com"} for n in range(1, 6)]
    customers[0]["email"] = "changed@example.com"
    assert CUSTOMERS[0]["email"] == "customer1@example.com"


def test_the_send_email_schema_requires_to_subject_and_body() -> None:
    # Tool.validate_args is not called here: it reads model_fields on an instance, which
    # pydantic 2.11 deprecates and this project turns warnings into errors.
    assert set(send_email.binding.input_schema["required"]) == {"to", "subject", "body"}
