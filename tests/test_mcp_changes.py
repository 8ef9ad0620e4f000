"""An MCP server whose tools change while its pool runs: the pool hears it (the tools
list-changed event), lists the tools again and announces a changed tool as a new binding; a thread
pinned to the old binding keeps it, and its call fails with a routing error instead of calling the
new tool. Real processes: a Brain, a Hands pool and its stdio server (``tests/mcp_server.py``,
whose ``reshape`` tool changes ``charge``, removes ``decline`` and adds ``refund_all``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import Observer, Processes, TendonEnv, run_cli, wait_for
from tests.test_e2e_mcp import BRAIN, calls, hands, stdio

pytestmark = pytest.mark.chaos


def agent(tmp_path: Path, name: str, call: dict[str, Any]) -> Path:
    definition = {
        "name": name, "version": "1", "instructions": "Use the tools.",
        "model": {"kind": "scripted", "script": [{"tool_calls": [call]}, {"content": "Done:\n{results}"}]},
        "tools": [call["tool"]], "limits": {"max_model_calls": 4},
    }  # fmt: skip
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(definition))
    return path


async def run_turn(env: dict[str, str], obs: Observer, agent_file: Path, session: str, request: str) -> Any:
    args = ["-m", "brain", "submit", "--session", session, "--request-id", request, "--agent"]
    code, out, err = await run_cli([*args, str(agent_file), "Go"], env)
    assert code == 0, err
    await obs.wait_turn(out.strip(), "completed")
    (row,) = await obs.executions(out.strip())
    return row


async def test_a_changed_tool_is_announced_as_a_new_binding_and_a_pinned_thread_never_calls_it(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    env = tendon.env
    await processes.start_ready("brain", BRAIN, env)
    await processes.start_ready("hands", hands(stdio(log)), env)
    obs = Observer(tendon)
    old = agent(tmp_path, "old-charger", {"tool": "charge", "args": {"amount": 1}})
    first = await run_turn(env, obs, old, "s-old", "r1")  # the thread pins charge as listed at start
    assert first["status"] == "succeeded"
    before = await obs.fetch("SELECT binding FROM {brain}.bindings WHERE name = 'charge'")

    await run_turn(env, obs, agent(tmp_path, "reshaper", {"tool": "reshape", "args": {}}), "s-shape", "r2")

    async def announced() -> list[Any] | None:
        rows = await obs.fetch(
            "SELECT name, binding FROM {brain}.bindings WHERE name IN ('charge', 'refund_all')"
        )
        return rows if len(rows) == 3 else None

    rows = await wait_for(announced, timeout=30, what="the changed tools to be announced")
    charges = [r["binding"] for r in rows if r["name"] == "charge"]
    (new_charge,) = [b for b in charges if b["digest"] != before[0]["binding"]["digest"]]
    assert "currency" in new_charge["input_schema"]["properties"]
    assert new_charge["version"] != before[0]["binding"]["version"]

    # The thread pinned to the old binding keeps it: its call is refused, the new tool not called.
    again = await run_turn(env, obs, old, "s-old", "r3")
    assert again["status"] == "failed" and again["error"]["code"] == "routing_error", again["error"]
    assert "is not served by route" in again["error"]["message"]
    assert len(calls(log, "charge")) == 1, "the old binding never called the new tool"

    # A new thread freezes the new binding and calls the tool as the server lists it now.
    new = agent(tmp_path, "new-charger", {"tool": "charge", "args": {"amount": 3, "currency": "EUR"}})
    third = await run_turn(env, obs, new, "s-new", "r4")
    assert third["status"] == "succeeded", third["error"]
    assert third["result"]["structuredContent"] == {"charged": 3, "currency": "EUR"}
    assert calls(log, "charge")[-1]["currency"] == "EUR"
    added = await run_turn(
        env, obs, agent(tmp_path, "refunder", {"tool": "refund_all", "args": {}}), "s-r", "r5"
    )
    assert added["status"] == "succeeded"
