"""LangGraph run webhooks, driven by the unmodified ``langgraph-sdk`` client against a Brain on the
embedded backend, with a real HTTP receiver on loopback: a run's webhook is POSTed once its turn
ended (or stopped at an interrupt), tried again after a failure until a 2xx, then never again; a
receiver that never takes it is given up after the bounded number of tries, which the turn's
journal says; a URL that is not http(s) is refused before anything runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import UnprocessableEntityError

from brain.rules.langgraph import WEBHOOK_ATTEMPTS, webhook_delay, webhook_url
from infra.process.settings import Settings
from local.testing import LocalTendon, local_tendon
from protocol import SchemaError

HI = {"messages": [{"role": "user", "content": "greet Ada"}]}
GREET = {"tool_calls": [{"tool": "greet", "args": {"name": "Ada"}}]}
PLAIN = {"tools": ["greet"], "model": {"kind": "scripted", "script": [GREET, {"content": "I greeted Ada."}]}}
GUARDED = {**PLAIN, "approvals": ["greet"]}


class Receiver:
    """A webhook receiver on loopback: ``/ok`` takes every POST, ``/flaky`` fails the first two,
    ``/down`` fails every one; each POST is kept (path, status answered, body)."""

    def __init__(self) -> None:
        self.got: list[tuple[str, int, Any]] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        path = request.path
        tries = sum(1 for p, _, _ in self.got if p == path)
        status = {"/ok": 200, "/flaky": 500 if tries < 2 else 204, "/down": 503}[path]
        self.got.append((path, status, await request.json()))
        return web.Response(status=status)

    def of(self, path: str) -> list[tuple[str, int, Any]]:
        return [g for g in self.got if g[0] == path]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = Receiver()
    app = web.Application()
    app.router.add_post("/{name}", r.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    r.url = f"http://127.0.0.1:{port}"
    try:
        yield r
    finally:
        await runner.cleanup()


@pytest.fixture
async def tendon(tmp_path: Path) -> AsyncIterator[LocalTendon]:
    # the receiver is on loopback, which a webhook may name only when allowed
    settings = Settings(scan_interval=0.2, reconnect_grace=0.5, webhook_private=True)
    async with local_tendon(tmp_path, "examples.hello_tools", settings=settings) as running:
        yield running


def client(tendon: LocalTendon) -> LangGraphClient:
    return get_client(url=f"{tendon.url}/langgraph")


async def until(check: Callable[[], bool], limit: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + limit
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "not in time"
        await asyncio.sleep(0.05)


async def test_a_webhook_is_posted_when_the_run_ends_retried_until_taken_and_then_never_again(
    tendon: LocalTendon, receiver: Receiver
) -> None:
    lg = client(tendon)
    assistant = (await lg.assistants.create(graph_id="plain", context={"agent": PLAIN}))["assistant_id"]
    thread = (await lg.threads.create())["thread_id"]
    # When a run with a webhook whose receiver fails twice ends
    run = await lg.runs.create(thread, assistant, input=HI, webhook=f"{receiver.url}/flaky")
    await lg.runs.join(thread, run["run_id"])
    await until(lambda: any(status == 204 for _, status, _ in receiver.of("/flaky")))
    # Then it was tried until taken, each time the run as it ended
    assert [status for _, status, _ in receiver.of("/flaky")] == [500, 500, 204]
    for _, _, body in receiver.of("/flaky"):
        assert (body["run_id"], body["thread_id"], body["status"]) == (run["run_id"], thread, "success")
        assert body["assistant_id"] == assistant
    store = tendon.system.brain
    for _ in range(100):  # the receiver answered; the Brain records it just after
        row = await store.read(lambda conn: store.langgraph.webhook(conn, run["run_id"]))
        if row["status"] != "pending":
            break
        await asyncio.sleep(0.05)
    assert (row["status"], row["attempts"]) == ("delivered", 3)
    # And never again once taken
    await asyncio.sleep(1.0)
    assert len(receiver.of("/flaky")) == 3


async def test_a_run_stopped_at_an_interrupt_posts_its_webhook_and_a_bad_url_is_refused(
    tendon: LocalTendon, receiver: Receiver
) -> None:
    lg = client(tendon)
    assistant = (await lg.assistants.create(graph_id="guarded", context={"agent": GUARDED}))["assistant_id"]
    thread = (await lg.threads.create())["thread_id"]
    stopped = await lg.runs.wait(thread, assistant, input=HI, webhook=f"{receiver.url}/ok")
    assert stopped["__interrupt__"]
    await until(lambda: bool(receiver.of("/ok")))
    ((_, _, body),) = receiver.of("/ok")
    assert body["status"] == "success" and body["thread_id"] == thread
    # A URL that is not http(s), or has no host, is refused before anything runs
    other = (await lg.threads.create())["thread_id"]
    for bad in ("ftp://127.0.0.1/hook", "file:///etc/passwd", "http://", "not a url"):
        with pytest.raises(UnprocessableEntityError, match="webhook"):
            await lg.runs.create(other, assistant, input=HI, webhook=bad)
    with pytest.raises(UnprocessableEntityError, match="after_seconds"):
        await lg.runs.create(other, assistant, input=HI, webhook=f"{receiver.url}/ok", after_seconds=60)
    assert await lg.runs.list(other) == []


async def test_a_webhook_no_receiver_takes_is_given_up_after_its_tries_and_the_turn_says_so(
    tendon: LocalTendon, receiver: Receiver
) -> None:
    lg = client(tendon)
    assistant = (await lg.assistants.create(graph_id="plain", context={"agent": PLAIN}))["assistant_id"]
    thread = (await lg.threads.create())["thread_id"]
    run = await lg.runs.wait(thread, assistant, input=HI, webhook=f"{receiver.url}/down")
    assert run["messages"][-1]["content"] == "I greeted Ada."
    store, run_id = tendon.system.brain, str((await lg.runs.list(thread))[0]["run_id"])

    async def status() -> str:
        return str((await store.read(lambda conn: store.langgraph.webhook(conn, run_id)))["status"])

    deadline = asyncio.get_running_loop().time() + 30
    while await status() != "failed":
        assert asyncio.get_running_loop().time() < deadline, receiver.got
        await asyncio.sleep(0.1)
    assert len(receiver.of("/down")) == WEBHOOK_ATTEMPTS
    async with httpx.AsyncClient(base_url=tendon.url, timeout=10) as http:
        events = (await http.get(f"/v1/sessions/{thread}/events", params={"limit": 1000})).json()["events"]
    (failed,) = [f for e in events for f in e["facts"] if f["kind"] == "turn.webhook_failed"]
    assert (failed["attempts"], failed["error"]) == (WEBHOOK_ATTEMPTS, "HTTP 503")
    await asyncio.sleep(0.5)
    assert len(receiver.of("/down")) == WEBHOOK_ATTEMPTS  # and no more


INSIDE = ["http://127.0.0.1:8000/h", "http://localhost/h", "http://LOCALHOST./h", "http://api.localhost/h",
          "http://10.1.2.3/h", "http://192.168.0.1/h", "http://172.16.0.9/h", "http://169.254.169.254/latest",
          "http://[::1]:80/h", "http://0.0.0.0/h", "http://[fe80::1]/h"]  # fmt: skip
REFUSED = ["ftp://example.com/h", "http://", "//example.com/h", "example.com", "http://example.com:port/h",
           "javascript:alert(1)", "", 7, None, "http://" + "a" * 2000 + ".com/"]  # fmt: skip


def test_a_webhook_names_an_outside_http_url_unless_inside_addresses_are_allowed() -> None:
    assert webhook_url("https://hooks.example.com/tendon?x=1") == "https://hooks.example.com/tendon?x=1"
    for url in INSIDE:
        with pytest.raises(SchemaError, match="TENDON_WEBHOOK_PRIVATE"):
            webhook_url(url)
        assert webhook_url(url, private=True) == url
    for bad in REFUSED:
        with pytest.raises(SchemaError, match="webhook"):
            webhook_url(bad, private=True)
    # the delay doubles from the scan interval, up to its cap
    assert [webhook_delay(n, 0.5) for n in (1, 2, 3)] == [0.5, 1.0, 2.0] and webhook_delay(40, 0.5) == 300.0
