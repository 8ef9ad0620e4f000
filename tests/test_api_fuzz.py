"""A property-based run against the OpenAPI document: Schemathesis generates requests for every
operation (valid and invalid paths, queries, headers and bodies) and checks that none gets a 5xx
from `brain serve --local`. Bad input must come back as a structured 4xx, never as a crash: every
answer matches the document, and every error has the one error shape (a check of its own,
tests/schemathesis_hooks.py). tests/test_api_input.py sends a table of known nasty inputs.

Random ids would only ever meet 404s, so the run first records a session with a finished turn
and a waiting one, and most generated requests name those (Schemathesis dictionaries): the
numbers, filters, controls and bodies it makes up then reach the store.

The stream route is left out: an SSE answer stays open by design, so a request to it ends by
timing out rather than with a status to check (its behaviour has its own tests in test_api)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
from pathlib import Path

import httpx

from tests.support import REPO, Processes, free_port
from tests.test_api import TOOL_THEN_DONE, agent
from tests.test_console import local_server

WAITS = agent(
    [{"tool_calls": [{"tool": "slow_step", "args": {"seconds": 600}}]}, {"content": "late"}], name="waits"
)


async def seed(url: str) -> dict[str, list[str]]:
    """A session with a finished turn and a running one; their ids, by dictionary."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        turns = []
        for request_id, spec, thread in (("r1", TOOL_THEN_DONE, "main"), ("r2", WAITS, "side")):
            body = {"request_id": request_id, "input": "go", "agent": spec, "thread": thread}
            answer = await http.post("/v1/sessions/s-fuzz/turns", json=body)
            assert answer.status_code == 201, answer.text
            turns.append(answer.json()["turn_id"])
        done = await http.get(f"/v1/turns/{turns[0]}", params={"wait": "20s"})
        assert done.json()["status"] == "completed", done.text
        executions = (await http.get(f"/v1/turns/{turns[0]}/executions")).json()
    ids = [e["id"] for e in executions]
    return {"sessions": ["s-fuzz"], "threads": ["main", "side"], "turns": turns, "executions": ids}


def config(ids: dict[str, list[str]]) -> str:
    def values(items: list[str]) -> str:
        return json.dumps(items)

    lines = [f"[dictionaries.{name}]\nvalues = {values(items)}\n" for name, items in ids.items()]
    bindings = {
        "path.session_id": "sessions",
        "path.turn_id": "turns",
        "path.execution_id": "executions",
        "query.thread": "threads",
        "query.turn": "turns",
    }
    lines.append("[parameters]")
    # A wait on the running turn lasts as long as it says (up to a minute): keep waits short
    # (their parsing has its own tests).
    lines.append('"query.wait" = "0.2s"')
    lines += [f'"{key}" = {{ dictionary = "{name}", probability = 1.0 }}' for key, name in bindings.items()]
    return "\n".join(lines) + "\n"


async def test_no_generated_request_gets_a_server_error(processes: Processes, tmp_path: Path) -> None:
    # Its stop hands the waiting turn's tool back at once instead of letting it run for the drain.
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    await local_server(processes, tmp_path, ["tests.brain_e2e_tools"], port, {"TENDON_DRAIN_SECONDS": "0"})
    (tmp_path / "schemathesis.toml").write_text(config(await seed(url)))
    st = shutil.which("st") or f"{sys.executable} -m schemathesis.cli"
    args = [*st.split(), "--config-file", str(tmp_path / "schemathesis.toml"), "run", f"{url}/openapi.json"]
    # Every answer matches the document; every error has the one error shape (tests/schemathesis_hooks.py)
    checks = "not_a_server_error,response_schema_conformance,error_shape"
    args += ["--checks", checks, "--exclude-path-regex", "stream"]
    args += ["--max-examples", "30", "--request-timeout", "10", "--seed", "15", "--no-color"]
    # Its example database goes to the test's directory, not the checkout (cwd).
    hooks = {"SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks", "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        *args, cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **hooks},
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=400)
    report = out.decode(errors="replace")
    assert proc.returncode == 0, report
    # It really ran: every operation of the document but the stream was exercised.
    # ("10 operations" in a warning is not "0 operations")
    assert "passed" in report and re.search(r"(?<![0-9])0 operations", report) is None, report
