"""An MCP task that asks for input (the Tasks extension's ``input_required``) is a pending
interaction on the turn, answered with `brain respond`; the answer goes to the server with
``tasks/update`` and the task goes on. Real processes: a Brain, a Hands pool, and the test MCP
server (``tests/mcp_server.py``: its ``refund`` tool asks "Refund N EUR?" as an elicitation).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.support import Observer, Processes, TendonEnv, run_cli, wait_for
from tests.test_e2e_mcp import BRAIN, agent, calls, hands, http_server, records, submit

pytestmark = pytest.mark.chaos


async def asking(obs: Observer, turn_id: str) -> list[Any]:
    """The turn's executions once both ask a person for input."""

    async def asks() -> list[Any] | None:
        rows = await obs.executions(turn_id)
        return rows if len(rows) == 2 and all(r["how"] == "awaiting_input" for r in rows) else None

    return await wait_for(asks, timeout=30, what="the execution to ask for input")


async def respond(env: dict[str, str], turn_id: str, call: str, *answer: str) -> tuple[int, str]:
    code, out, err = await run_cli(["-m", "brain", "respond", turn_id, call, *answer, "--json"], env)
    return code, out + err


async def test_tasks_asking_for_input_are_answered_with_brain_respond_across_a_brain_and_a_hands_restart(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    url = await http_server(processes, log)  # outlives the Hands: its tasks are in its memory
    env = tendon.env
    brain = await processes.start_ready("brain", BRAIN, env)
    pool = await processes.start_ready("hands", hands(url), env)
    calls_of = [{"tool": "refund", "args": {"amount": 12}}, {"tool": "refund", "args": {"amount": 5}}]
    turn_id = await submit(env, agent(tmp_path, [calls_of], ["refund"]))

    obs = Observer(tendon)
    yes, no = await asking(obs, turn_id)
    assert yes["status"] == "running"
    assert yes["input_request"]["message"] == "Refund 12 EUR?"
    assert yes["input_request"]["requests"]["confirm"]["method"] == "elicitation/create"
    turn = await obs.turn(turn_id)
    assert turn["status"] == "waiting" and "EUR?" in turn["waiting_for"]
    code, shown, err = await run_cli(["-m", "brain", "show", turn_id, "--json"], env)
    assert code == 0, err
    shown_rows = json.loads(shown)["executions"]
    assert [r["awaits"] for r in shown_rows] == ["input", "input"]
    assert shown_rows[1]["asks"]["message"] == "Refund 5 EUR?"

    # The Brain dies while the turn waits for the person, and comes back: the question is a row.
    brain.send_signal(signal.SIGKILL)
    await processes.wait_exit(brain)
    await processes.start_ready("brain", BRAIN, env)
    # The Hands die too, and the person answers while no Hands runs: the answer waits in the queue,
    # then in the ledger, for the worker that takes the task over.
    pool.send_signal(signal.SIGKILL)
    await processes.wait_exit(pool)
    code, said = await respond(env, turn_id, yes["call_id"], "--approve")
    assert code == 6 and "not an approval" in said, said  # rejected: it asks for input
    code, said = await respond(env, turn_id, yes["call_id"], "--result", '{"ok": true}')
    assert code == 0 and json.loads(said)["status"] == "applied", said
    code, said = await respond(env, turn_id, yes["call_id"], "--result", '{"ok": false}')
    assert code == 6 and "waits for no answer" in said, said  # answered once
    code, said = await respond(env, turn_id, no["call_id"], "--deny", "not this one")
    assert code == 0, said
    await processes.start_ready("hands", hands(url), env)

    await obs.wait_turn(turn_id, "completed")
    yes, no = await obs.executions(turn_id)
    assert yes["status"] == no["status"] == "succeeded"
    assert yes["result"]["structuredContent"] == {"refunded": 12}
    assert no["result"]["structuredContent"] == {"refunded": 0}  # the elicitation was declined
    assert len(calls(log, "refund")) == 2, "re-attached by their task ids, never called again"
    tasks = {c["op"]: c["task"] for c in calls(log, "refund")}
    sent = {u["op"]: u["responses"] for u in records(log, "update")}
    assert len(records(log, "update")) == 2, "each answer sent once"
    assert sent == {
        tasks[yes["id"]]: {"confirm": {"action": "accept", "content": {"ok": True}}},
        tasks[no["id"]]: {"confirm": {"action": "decline"}},
    }
    kinds = [f["kind"] for e in await obs.fetch("SELECT facts FROM {brain}.journal") for f in e["facts"]]
    assert kinds.count("execution.input_required") == 2, "asked once each, though two workers followed them"
    assert kinds.count("execution.input_given") == 2
