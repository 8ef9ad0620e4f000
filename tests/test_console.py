"""The live console in a real headless browser (the system's Chromium, driven by Playwright),
against `brain serve --local`: a Brain, a Hands pool and the HTTP API in one process on the
embedded backend. The page lists the session's turns, follows one, shows its tool call appear,
run and complete with its output, and sends controls that come back with their receipts. And
`brain watch`, the same in a terminal, stopped (Ctrl-C, or killed) and resumed."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import sys
from pathlib import Path

import httpx
import pytest
from playwright.async_api import async_playwright, expect

from tests.support import REPO, Processes, free_port, wait_for
from tests.test_api import agent

APPROVED = agent(
    [{"tool_calls": [{"tool": "wire_money", "args": {"amount": 5, "to": "x"}}]}, {"content": "all done"}],
    name="approved",
    tools=["wire_money"],
)
SLOW = agent([{"tool_calls": [{"tool": "slow_step", "args": {"seconds": 3}}]}, {"content": "all done"}])


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("no Chromium on this machine: install the system package (apt-get install chromium)")


async def local_server(processes: Processes, tmp_path: Path, env: dict[str, str] | None = None) -> str:
    port = free_port()
    args = ["-m", "brain", "serve", "--local", "--data-dir", str(tmp_path / "data")]
    args += ["--tools", "tests.brain_e2e_tools", "--http", f"127.0.0.1:{port}"]
    await processes.start_ready("local", args, {"TENDON_LOG_FORMAT": "json", **(env or {})})
    url = f"http://127.0.0.1:{port}"

    async def answers() -> bool:
        # The Hands pools of the process may be ready before its Brain's HTTP API.
        async with httpx.AsyncClient(base_url=url) as http:
            try:
                return (await http.get("/openapi.json")).status_code == 200
            except httpx.TransportError:
                return False

    await wait_for(answers, timeout=30, what="the local server's HTTP API")
    return url


async def test_the_console_follows_a_turn_as_its_tool_call_appears_runs_and_completes(
    processes: Processes, tmp_path: Path
) -> None:
    url = await local_server(processes, tmp_path)
    async with async_playwright() as p, httpx.AsyncClient(base_url=url, timeout=30) as http:
        browser = await p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        try:
            page = await browser.new_page()
            await page.goto(f"{url}/console?session=s-console")
            body = {"request_id": "r1", "input": "take your time", "agent": SLOW}
            answer = await http.post("/v1/sessions/s-console/turns", json=body)
            assert answer.status_code == 201, answer.text
            turn = answer.json()["turn_id"]

            await page.click("#list")
            await page.click(f"tr[data-turn='{turn}']")
            await expect(page.locator("#turn-id")).to_have_text(turn)
            await expect(page.locator("#messages")).to_contain_text("take your time")
            call = page.locator("#calls tr").filter(has_text="slow_step")
            await expect(call).to_have_attribute("data-status", "running", timeout=30_000)

            # A control from the page: applied, with its receipt shown, and the turn goes on.
            await page.click("button[data-kind='pause']")
            await expect(page.locator("#receipt")).to_have_text("pause: applied", timeout=10_000)
            await page.click("button[data-kind='resume']")
            await expect(page.locator("#receipt")).to_have_text("resume: applied", timeout=10_000)

            await expect(call).to_have_attribute("data-status", "succeeded", timeout=30_000)
            await expect(call).to_contain_text('"slept":3')
            await expect(page.locator("#turn-status")).to_have_text("completed", timeout=30_000)
            await expect(page.locator("#messages")).to_contain_text("all done")
        finally:
            await browser.close()
    done = (await httpx.AsyncClient(base_url=url).get(f"/v1/turns/{turn}")).json()
    assert done["status"] == "completed"  # watching and controlling from the page lost nothing


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
    seqs = [int(m.group(1)) for m in re.finditer(r"^#\s*(\d+) ", out, re.M)]
    return list(dict.fromkeys(seqs))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
async def test_brain_watch_follows_a_turn_and_resumes_where_it_stopped(
    processes: Processes, tmp_path: Path, sig: int
) -> None:
    url = await local_server(processes, tmp_path)
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
