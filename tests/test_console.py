"""The console in a real headless browser (the system's Chromium, driven by Playwright) against
`brain serve --local`: a Brain, Hands pools and the HTTP API in one process on the embedded
backend. Each view is kept as a screenshot (``TENDON_TEST_ARTIFACTS``/console, else the test's
tmp dir) and checked for what it shows: the sessions and a session's turns; a turn followed live
through a crash of its process and a restart (the five-email story: the crash, the verification
by query, five sends, every journal entry once); a tool's output as it comes, an approval and a
manual tool's answer given from the page, controls enabled only where they apply; an UNKNOWN
execution reconciled from the operator's view, with the routes and the workers serving them.
And `brain watch`, the same in a terminal, stopped (Ctrl-C, or killed) and resumed."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Page, async_playwright, expect

from examples.mailbox import MailboxServer
from tests.support import REPO, Processes, free_port, wait_for
from tests.test_api import agent

CHROMIUM = "/usr/bin/chromium"
# Headless, and nothing of Chromium's own that would reach for a network these machines lack.
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]  # fmt: skip
SEEN = 30_000  # ms an expectation of the page may wait (a busy machine runs the turn slowly)

APPROVED = agent(
    [{"tool_calls": [{"tool": "wire_money", "args": {"amount": 5, "to": "x"}}]}, {"content": "all done"}],
    name="approved",
    tools=["wire_money"],
)


@pytest.fixture
def screens(tmp_path: Path, request: pytest.FixtureRequest, record_property: Any) -> Path:
    """Where the test keeps its screenshots (said in the report)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: install the system package (apt-get install chromium)")
    base = os.environ.get("TENDON_TEST_ARTIFACTS")
    folder = Path(base) / "console" / request.node.name if base else tmp_path / "screens"
    folder.mkdir(parents=True, exist_ok=True)
    record_property("screenshots", str(folder))
    return folder


@asynccontextmanager
async def browser(screens: Path) -> AsyncIterator[Page]:
    async with async_playwright() as p:
        chromium = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await chromium.new_page(viewport={"width": 1300, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            yield page
            assert errors == [], errors  # the page's own scripts never failed
        finally:
            await chromium.close()


async def shot(page: Page, screens: Path, name: str) -> None:
    await page.screenshot(path=screens / f"{name}.png", full_page=True)


async def local_server(
    processes: Processes, tmp_path: Path, tools: list[str], port: int, env: dict[str, str] | None = None
) -> Any:
    """`brain serve --local` on ``tmp_path``'s data directory with ``tools``, once its API answers."""
    args = [
        "-m",
        "brain",
        "serve",
        "--local",
        "--data-dir",
        str(tmp_path / "data"),
        "--http",
        f"127.0.0.1:{port}",
    ]
    for module in tools:
        args += ["--tools", module]
    proc = await processes.start_ready("local", args, {"TENDON_LOG_FORMAT": "json", **(env or {})})

    async def answers() -> bool:
        # The Hands pools of the process may be ready before its Brain's HTTP API.
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            try:
                return (await http.get("/openapi.json")).status_code == 200
            except httpx.TransportError:
                return False

    await wait_for(answers, timeout=30, what="the local server's HTTP API")
    return proc


async def submit(url: str, session: str, definition: dict[str, Any], text: str = "go") -> str:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        answer = await http.post(
            f"/v1/sessions/{session}/turns", json={"request_id": "r1", "input": text, "agent": definition}
        )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["turn_id"])


async def journal_seqs(page: Page) -> list[int]:
    seqs = await page.locator("#journal .entry").evaluate_all(
        "(rows) => rows.map((r) => Number(r.dataset.seq))"
    )
    return list(dict.fromkeys(seqs))


# ---- the five-email story, followed live through a crash -----------------------------------


def notices(gate: Path) -> dict[str, Any]:
    """The example's notice agent, its first model call held until ``gate`` exists (so that the
    page follows the turn before its process dies)."""
    definition = json.loads((REPO / "examples" / "notice_agent.json").read_text())
    definition["model"]["script"][0]["gate"] = str(gate)
    return definition  # type: ignore[no-any-return]


async def test_a_crashed_and_resumed_five_email_turn_shows_the_crash_the_verification_and_five_sends(
    processes: Processes, tmp_path: Path, screens: Path
) -> None:
    port, gate = free_port(), tmp_path / "go"
    url = f"http://127.0.0.1:{port}"
    with MailboxServer(port=0, state_path=tmp_path / "mailbox.json") as mailbox:
        env = {"TENDON_MAILBOX_URL": mailbox.url}
        # Given a local server whose process dies while email 4 is inside send_email
        server = await local_server(
            processes,
            tmp_path,
            ["examples.email_tools"],
            port,
            {**env, "TENDON_KILL_AT": "hands.after_tool_body@call-4"},
        )
        async with browser(screens) as page:
            await page.goto(f"{url}/")
            await expect(page.locator("#sessions")).to_contain_text("No session yet")
            turn = await submit(url, "notices", notices(gate), "Send the maintenance notice")
            # When a person finds the turn from the list of sessions and opens it
            await page.goto(f"{url}/")
            await expect(page.locator("#sessions tr[data-session='notices']")).to_contain_text(
                "notice-sender v1"
            )
            await shot(page, screens, "sessions")
            await page.click("#sessions tr[data-session='notices']")
            await expect(page.locator("#turns tr")).to_contain_text("Send the maintenance notice")
            await shot(page, screens, "session")
            await page.click(f"#turns tr[data-turn='{turn}']")
            await expect(page.locator("#live")).to_have_text("live", timeout=SEEN)
            # And follows it live while its process dies and is started again
            gate.write_text("go")
            assert await processes.wait_exit(server, timeout=60) == -signal.SIGKILL
            await expect(page.locator("#live")).to_contain_text("reconnecting", timeout=SEEN)
            await shot(page, screens, "turn-reconnecting")
            await local_server(processes, tmp_path, ["examples.email_tools"], port, env)
            await expect(page.locator("#turn-status")).to_have_text("completed", timeout=60_000)
            await expect(page.locator("#live")).to_have_text("ended", timeout=SEEN)
            # Then the page shows five emails sent, the fourth verified by query after its worker died
            calls = page.locator("#calls .call[data-status='succeeded']")
            await expect(calls).to_have_count(5, timeout=SEEN)
            fourth = page.locator("#calls .call[data-call='call-4']")
            await expect(fourth).to_contain_text("verified by query")
            await expect(fourth).to_contain_text("customer4@example.com")
            await expect(page.locator("#timeline g.mark[data-mark='died']")).to_have_count(1)
            await expect(page.locator("#timeline g.mark[data-mark='verified']")).to_have_count(1)
            await expect(page.locator("#timeline .marks")).to_contain_text("died inside the tool")
            await expect(page.locator("#journal")).to_contain_text(
                "send_email (call-4) succeeded: verified by query"
            )
            await expect(page.locator("#messages .msg.assistant").last).to_contain_text("Sent the notice")
            await shot(page, screens, "turn-five-emails")
            await page.locator("#timeline-part").screenshot(path=screens / "timeline-five-emails.png")
            # And every journal entry is shown once, across the reconnect, in order
            async with httpx.AsyncClient(base_url=url) as http:
                events = (await http.get("/v1/sessions/notices/events", params={"limit": 1000})).json()
            assert await journal_seqs(page) == [e["seq"] for e in events["events"]]
        assert len(mailbox.stats()["deliveries"]) == 5  # nothing was sent twice


# ---- a person at the page: output, approvals, a manual tool, controls, an operator -----------


def desk(gate: Path) -> dict[str, Any]:
    """An agent that writes a report (waiting for ``gate`` before its last line), pays once a
    person approves, and asks a person (a manual tool)."""
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"tool": "write_report", "args": {"lines": 3, "gate": str(gate)}}]},
        {"tool_calls": [{"tool": "pay", "args": {"amount": 5, "to": "ann"}}]},
        {"tool_calls": [{"tool": "ask_person", "args": {"question": "ship it?"}}]},
        {"content": "{results}"},
    ]
    manual = [{"name": "ask_person", "description": "ask a person", "input_schema": {"type": "object"}}]
    return agent(script, name="desk", tools=["write_report", "pay"], manual_tools=manual)


async def enabled(page: Page) -> dict[str, bool]:
    buttons = page.locator(".controls button")
    return {
        kind: await buttons.nth(i).is_enabled()
        for i, kind in enumerate(await buttons.evaluate_all("(b) => b.map((x) => x.dataset.kind)"))
    }


async def test_a_person_follows_output_answers_an_approval_and_a_manual_tool_from_the_page(
    processes: Processes, tmp_path: Path, screens: Path
) -> None:
    port, gate = free_port(), tmp_path / "last-line"
    url = f"http://127.0.0.1:{port}"
    server = await local_server(processes, tmp_path, ["tests.console_tools"], port)

    async def said_where() -> bool:
        return f"the console at {url}/console" in processes.output(server)

    await wait_for(said_where, timeout=10, what="the server to say where its console is")
    async with browser(screens) as page:
        turn = await submit(url, "desk", desk(gate), "write the report, pay Ann, ask me")
        await page.goto(f"{url}/?session=desk&turn={turn}")
        # The report's output shows as it is written, before the tool ends
        report = page.locator("#calls .call[data-call='call-1']")
        await expect(report.locator(".output")).to_contain_text("line 2 of 3", timeout=SEEN)
        await expect(report).to_have_attribute("data-status", "running")
        assert await enabled(page) == {
            "pause": True, "resume": False, "cancel": True, "steer": True, "inject": True,
        }  # fmt: skip
        await shot(page, screens, "turn-output")
        # A pause and a resume from the page: each enabled only while it applies
        await page.click("button[data-kind='pause']")
        await expect(page.locator("#receipt")).to_have_text("pause: applied", timeout=SEEN)
        await expect(page.locator("#turn-status")).to_have_text("paused", timeout=SEEN)
        await expect(page.locator("button[data-kind='pause']")).to_be_disabled()
        await page.click("button[data-kind='resume']")
        await expect(page.locator("#receipt")).to_have_text("resume: applied", timeout=SEEN)
        await expect(page.locator("button[data-kind='resume']")).to_be_disabled(timeout=SEEN)
        gate.write_text("go")
        await expect(report.locator(".output")).to_contain_text("line 3 of 3", timeout=SEEN)
        # The payment waits for the person, who approves it from the page
        approval = page.locator("#approvals .approval[data-call='call-2']")
        await expect(approval).to_contain_text('"to": "ann"', timeout=SEEN)
        await expect(page.locator("#waits")).to_contain_text("approval of pay call-2")
        await shot(page, screens, "turn-approval")
        await approval.locator("button.approve").click()
        await expect(page.locator("#receipt")).to_have_text("approve call-2: applied", timeout=SEEN)
        await expect(page.locator("#calls .call[data-call='call-2']")).to_have_attribute(
            "data-status", "succeeded", timeout=SEEN
        )
        # The manual tool's answer is given from the page
        manual = page.locator("#approvals .approval[data-call='call-3']")
        await manual.locator("textarea").fill('{"answer": "yes"}', timeout=SEEN)
        await manual.locator("button.give").click()
        await expect(page.locator("#turn-status")).to_have_text("completed", timeout=SEEN)
        await expect(page.locator("#messages")).to_contain_text('"answer": "yes"')
        assert await enabled(page) == dict.fromkeys(("pause", "resume", "cancel", "steer", "inject"), False)
        journal = page.locator("#journal")
        await expect(journal).to_contain_text("pay (call-2) waits for a person's approval")
        await expect(journal).to_contain_text("A person approved pay (call-2)")
        await expect(journal.locator(".entry .at").first).to_have_text(re.compile(r"^\d\d:\d\d:\d\d\.\d{3}$"))
        await shot(page, screens, "turn-answered")


def letter(marker: Path) -> dict[str, Any]:
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"tool": "post_letter", "args": {"to": "ann", "marker": str(marker)}}]},
        {"content": "{results}"},
    ]
    return agent(script, name="letters", tools=["post_letter"])


async def test_an_operator_reconciles_an_unknown_execution_from_the_page_and_sees_who_serves_each_route(
    processes: Processes, tmp_path: Path, screens: Path
) -> None:
    port, marker = free_port(), tmp_path / "posted"
    url = f"http://127.0.0.1:{port}"
    # Given a letter whose posting took its process down after it acted: UNKNOWN once restarted
    server = await local_server(processes, tmp_path, ["tests.console_tools"], port)
    turn = await submit(url, "letters", letter(marker), "post the letter to Ann")
    assert await processes.wait_exit(server, timeout=60) == -signal.SIGKILL
    await local_server(processes, tmp_path, ["tests.console_tools"], port)
    async with browser(screens) as page:
        await page.goto(f"{url}/?view=operator")
        unknown = page.locator("#unknown .unknown")
        await expect(unknown).to_contain_text("post_letter (call-1)", timeout=SEEN)
        await expect(unknown).to_contain_text("worker died inside the body of unsafe tool post_letter")
        await expect(page.locator("#routes tr[data-route='desk'] .workers")).to_have_text("1 worker(s)")
        await expect(page.locator("#parked")).to_contain_text("Nothing is parked")
        await shot(page, screens, "operator-unknown")
        # When the operator says what happened and how they know
        await unknown.locator("textarea.value").fill('{"posted_to": "ann"}')
        await unknown.locator("input.evidence").fill("the post office's receipt 4411")
        await unknown.locator("input.actor").fill("ops")
        await unknown.locator("button.reconcile").click()
        await expect(unknown.locator(".said")).to_contain_text("reconciled: succeeded", timeout=SEEN)
        # Then the turn goes on, and its timeline shows the UNKNOWN and its reconcile
        await page.goto(f"{url}/?session=letters&turn={turn}")
        await expect(page.locator("#turn-status")).to_have_text("completed", timeout=SEEN)
        await expect(page.locator("#timeline g.mark[data-mark='died']")).to_have_count(1)
        await expect(page.locator("#timeline g.mark[data-mark='unknown']")).to_have_count(1)
        await expect(page.locator("#timeline g.mark[data-mark='reconciled']")).to_have_count(1)
        card = page.locator("#calls .call[data-call='call-1']")
        await expect(card).to_contain_text("reconciled by an operator")
        await expect(card).to_contain_text("the post office's receipt 4411")
        await shot(page, screens, "turn-reconciled")
        await page.locator("#timeline-part").screenshot(path=screens / "timeline-reconciled.png")
        await page.goto(f"{url}/?view=operator")
        await expect(page.locator("#unknown")).to_contain_text("No execution is UNKNOWN", timeout=SEEN)


async def _watch(url: str, turn: str, cache: Path, *, stop_after: str | None, sig: int) -> tuple[int, str]:
    """`brain watch TURN` until it ends, or until it printed ``stop_after`` (then signal ``sig``)."""
    env = {**os.environ, "TENDON_URL": url, "XDG_CACHE_HOME": str(cache), "COLUMNS": "200"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "brain", "watch", turn, cwd=REPO, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        # Ctrl-C as in a terminal, even when the suite itself runs in the background (a shell
        # starts background jobs with SIGINT ignored, and a child inherits that).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert proc.stdout is not None
    out = ""
    while line := (await asyncio.wait_for(proc.stdout.readline(), 60)).decode():
        out += line
        if stop_after is not None and stop_after in line:
            proc.send_signal(sig)
            out += (await proc.stdout.read()).decode()
            break
    return await proc.wait(), out


def shown_seqs(out: str) -> list[int]:
    """The entries a watch printed (each prints its facts' lines, numbered with its seq)."""
    seqs = [int(m.group(1)) for m in re.finditer(r"^\d\d:\d\d:\d\d\.\d{3} #\s*(\d+) ", out, re.M)]
    return list(dict.fromkeys(seqs))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
async def test_brain_watch_follows_a_turn_and_resumes_where_it_stopped(
    processes: Processes, tmp_path: Path, sig: int
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    await local_server(processes, tmp_path, ["tests.brain_e2e_tools"], port)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        # The turn waits for a person's approval until the first watch has been stopped, so the
        # stop lands mid-turn however slowly the watch starts.
        body = {"request_id": "r1", "input": "watch me", "agent": APPROVED}
        turn = (await http.post("/v1/sessions/s-watch/turns", json=body)).json()["turn_id"]
        code, first = await _watch(url, turn, tmp_path, stop_after="wire_money", sig=sig)
        assert code == (130 if sig == signal.SIGINT else -signal.SIGKILL), first
        approve = {"call": "call-1", "decision": "approve"}
        assert (await http.post(f"/v1/turns/{turn}/respond", json=approve)).status_code == 200
        code, rest = await _watch(url, turn, tmp_path, stop_after=None, sig=sig)
        everything = (await http.get("/v1/sessions/s-watch/events", params={"limit": 1000})).json()
    assert code == 0, rest
    assert "resuming after event" in rest and "turn completed" in rest, (first, rest)
    seqs = [e["seq"] for e in everything["events"]]
    before, after = shown_seqs(first), shown_seqs(rest)
    assert sorted(set(before + after)) == seqs  # no gap: every entry shown
    if sig == signal.SIGINT:
        assert not set(before) & set(after), (first, rest)  # and none twice
    else:
        # Killed between showing an entry and saving that it did: that one entry shows again.
        assert len(set(before) & set(after)) <= 1, (first, rest)
