"""AG-UI's own TypeScript client (``@ag-ui/client`` from the npm registry, run with Node.js) drives a
Tendon agent through the run endpoint: its HttpAgent checks that the events follow AG-UI's rules
and builds the conversation from them (the tool call, its result, the answer). Skipped with the
reason when Node.js or npm is absent; under CI=true that fails instead. A turn that stops at an
approval ends the client's run with AG-UI's interrupt outcome, and the client's own resume of its
pending interrupts goes on with the turn."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import httpx
import pytest

from local.testing import local_tendon
from tests.test_agui import GREETER

CLIENT = Path(__file__).parent / "agui_client"


async def _installed() -> None:
    """``npm ci`` once per checkout (node_modules is not kept in the repository)."""
    if (CLIENT / "node_modules" / "@ag-ui" / "client").is_dir():
        return
    proc = await asyncio.create_subprocess_exec(
        "npm", "ci", "--no-audit", "--no-fund", "--silent", cwd=CLIENT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, f"npm ci failed: {out.decode(errors='replace')[-2000:]}"


async def _ready() -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("Node.js and npm are needed for the AG-UI client test (CI=true: not skipped)")
        pytest.skip("Node.js and npm are not installed: AG-UI's TypeScript client cannot run")
    await _installed()


@pytest.mark.timeout(300)
async def test_ag_uis_typescript_client_runs_a_turn_and_builds_its_messages(tmp_path: Path) -> None:
    await _ready()
    async with local_tendon(tmp_path, "examples.hello_tools") as local:
        proc = await asyncio.create_subprocess_exec(
            "node", "run.mjs", local.url, "s-ts", "run-ts-1", json.dumps(GREETER), "greet Ada", cwd=CLIENT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
    said = json.loads(out.decode().strip().splitlines()[-1])
    assert said["types"][0] == "RUN_STARTED" and said["types"][-1] == "RUN_FINISHED"
    by_role = {}
    for message in said["messages"]:
        by_role.setdefault(message["role"], []).append(message)
    (call,) = [c for m in by_role["assistant"] for c in m.get("toolCalls") or []]
    assert call["function"]["name"] == "greet" and json.loads(call["function"]["arguments"]) == {
        "name": "Ada"
    }
    (result,) = by_role["tool"]
    assert result["toolCallId"] == call["id"] and json.loads(result["content"])["greeting"] == "Hello, Ada!"
    assert [m.get("content") for m in by_role["assistant"] if m.get("content")] == ["I greeted Ada."]


@pytest.mark.timeout(300)
async def test_ag_uis_typescript_client_resumes_an_approval_it_was_interrupted_by(tmp_path: Path) -> None:
    await _ready()
    guarded = {**GREETER, "name": "guarded", "approvals": ["greet"]}
    async with local_tendon(tmp_path, "examples.hello_tools") as local:
        proc = await asyncio.create_subprocess_exec(
            "node", "resume.mjs", local.url, "s-ts-resume", json.dumps(guarded), "greet Ada", cwd=CLIENT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        async with httpx.AsyncClient(base_url=local.url, timeout=10) as http:
            turns = (await http.get("/v1/sessions/s-ts-resume/turns")).json()
    assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
    said = json.loads(out.decode().strip().splitlines()[-1])
    # The first run stopped at the call waiting for approval, which the client kept as its interrupt
    assert said["first"][-2:] == ["STATE_SNAPSHOT", "RUN_FINISHED"]
    assert said["outcome"]["type"] == "interrupt" and said["pending"] == ["call-1"]
    # and its resume went on with the same turn to its end, nothing left pending
    assert said["second"][0] == "RUN_STARTED" and said["second"][-1] == "RUN_FINISHED"
    assert "TOOL_CALL_RESULT" in said["second"] and said["left"] == 0
    (result,) = [m for m in said["messages"] if m["role"] == "tool"]
    assert json.loads(result["content"])["greeting"] == "Hello, Ada!"
    assert said["state"]["waiting_for"] == []
    assert [t["status"] for t in turns] == ["completed"]
