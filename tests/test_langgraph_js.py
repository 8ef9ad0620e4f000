"""LangGraph's own JavaScript client (``@langchain/langgraph-sdk`` from the npm registry, run with
Node.js) drives the /langgraph API as the Python one does: it streams a run in messages-tuple and
values modes, joins its stream again from an event id and gets exactly the rest, stops at an
interrupt and resumes it, and finds a thread by its metadata. Skipped with the reason when Node.js
or npm is absent; under CI=true that fails instead."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from local.testing import local_tendon
from tests.test_langgraph_api import GREET, GUARDED

CLIENT = Path(__file__).parent / "langgraph_client"
GREETER = {
    "tools": ["greet"],
    "model": {"kind": "scripted", "script": [GREET, {"content": "I greeted Ada."}]},
}


async def _installed() -> None:
    """``npm ci`` once per checkout (node_modules is not kept in the repository)."""
    if (CLIENT / "node_modules" / "@langchain" / "langgraph-sdk").is_dir():
        return
    proc = await asyncio.create_subprocess_exec(
        "npm", "ci", "--no-audit", "--no-fund", "--silent", cwd=CLIENT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, f"npm ci failed: {out.decode(errors='replace')[-2000:]}"


@pytest.mark.timeout(300)
async def test_langgraphs_javascript_client_streams_rejoins_and_resumes_a_run(tmp_path: Path) -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("Node.js and npm are needed for the LangGraph JS client test (CI=true: not skipped)")
        pytest.skip("Node.js and npm are not installed: LangGraph's JavaScript client cannot run")
    await _installed()
    agents = json.dumps({"greeter": GREETER, "guarded": GUARDED})
    async with local_tendon(tmp_path, "examples.hello_tools") as local:
        proc = await asyncio.create_subprocess_exec(
            "node", "run.mjs", local.url, agents, cwd=CLIENT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
    said = json.loads(out.decode().strip().splitlines()[-1])
    parts, rest = said["parts"], said["rest"]
    # The stream: metadata, then the model's call, the tool's result and the answer as messages
    assert parts[0]["event"] == "metadata"
    messages = [p["data"][0] for p in parts if p["event"] == "messages"]
    assert [(m["type"], m.get("tool_call_id")) for m in messages] == [
        ("ai", None),
        ("tool", "call-1"),
        ("ai", None),
    ]
    assert messages[-1]["content"] == "I greeted Ada."
    # Joined again from an event's id: exactly the parts after it
    assert rest == parts[said["cut"] + 1 :]
    # An interrupt, then a resume that approves it
    assert [i["id"] for i in said["stopped"]["__interrupt__"]] == ["call-1"]
    assert [m["type"] for m in said["resumed"]["messages"]] == ["human", "ai", "tool", "ai"]
    assert "__interrupt__" not in said["resumed"]
    assert said["found"] == [said["thread"]]
