"""Waiting is free on the Hands side too (invariant 20): an MCP task that waits for a person, or
works on past a short poll window, is parked in the ledger: its row keeps the task id, no worker
holds it, nothing polls, and the pool's slot is free. The answer, a cancel or its wake time takes it
up again on any worker of the pool.

The ledger's part on PostgreSQL and SQLite; then real processes: a Brain, a Hands pool of
concurrency 1, and the test MCP server (``tests/mcp_server.py``: ``refund`` asks "Refund N EUR?",
``render`` works until its gate opens).
"""

from __future__ import annotations

import asyncio
import json
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from hands.rules.states import LedgerStatus
from hands.store import PARKED_PREFIX, Ledger
from hands.tools.mcp import ParkTimes, _Questions
from tests.support import Observer, Processes, TendonEnv, run_cli, wait_for
from tests.test_e2e_mcp import BRAIN, agent, calls, hands, http_server, records, stdio
from tests.test_hands_ledger import _execution, _get, ledger  # noqa: F401 - the fixture, both backends

pytestmark = pytest.mark.chaos

# ---- the rules ---------------------------------------------------------------------------------


def test_a_parked_task_is_looked_at_again_sooner_at_first_and_never_later_than_the_check_time() -> None:
    times = ParkTimes(after=5, check=60)
    assert [times.next_check(n, 100) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert times.next_check(0, 3000) == 3, "never sooner than the task's poll interval"
    assert times.next_check(40, None) == 60


def test_the_questions_of_a_parked_task_go_with_its_handle_and_a_repeat_is_a_new_round() -> None:
    # A worker answered question q (round 0) and parked the task while it worked on
    asked = _Questions()
    assert asked.key("q") == "q"
    asked.sent.add("q")
    asked.moved, asked.checks = True, 2
    handle = asked.state('{"mcp_task": "t1", "server": "s"}')
    assert json.loads(handle)["mcp_task"] == "t1"
    # The worker that takes it up knows q was answered: the same question again is round 1, asked
    # of the person anew, never answered with what they said before
    taken = _Questions.of(handle)
    assert (taken.sent, taken.checks) == ({"q"}, 2)
    assert taken.key("q") == "q#1"
    # A task parked before its question was answered is asked under the same key (the answer given
    # meanwhile is found under it)
    waiting = _Questions.of(_Questions().state('{"mcp_task": "t2"}'))
    assert waiting.key("q") == "q"


# ---- the ledger -------------------------------------------------------------------------------


async def _park(
    store: Ledger, execution_id: str, owner: str, wake_in: float, awaiting: str | None = None
) -> bool:
    return await store.transact(
        lambda c: store.park(c, execution_id, owner, '{"mcp_task":"t1","sent":[]}', wake_in, awaiting)
    )


async def _orphans(store: Ledger) -> list[str]:
    return [e for e, _ in await store.read(lambda c: store.open_orphans(c, "lab", "w9", 10))]


async def test_a_parked_row_is_nobodys_until_its_wake_time_an_answer_or_a_cancel(ledger: Ledger) -> None:  # noqa: F811
    # Given two running executions of w1 (no live worker has that name: an orphan until parked)
    waits, works = (
        await _execution(ledger, "w1", LedgerStatus.RUNNING),
        await _execution(ledger, "w1", LedgerStatus.RUNNING),
    )
    # When w1 parks them: one waiting for the answer to question q1, one for an hour
    assert await _park(ledger, waits, "w1", 3600, awaiting="q1")
    assert await _park(ledger, works, "w1", 3600)
    assert not await _park(ledger, works, "w2", 1), "only the owner parks"

    # Then the rows keep their handle, are nobody's, and no scan takes them before they are due
    row = await _get(ledger, waits)
    assert row.owner == PARKED_PREFIX + "w1" and row.status is LedgerStatus.RUNNING
    assert row.handle is not None and json.loads(row.handle)["mcp_task"] == "t1"
    assert row.wake_at is not None and (row.wake_at - datetime.now(UTC)).total_seconds() > 3000
    assert await _orphans(ledger) == []
    claim = await ledger.transact(lambda c: ledger.claim_orphan(c, waits, PARKED_PREFIX + "w1", "w9"))
    assert claim is None, "not claimed before it is due"

    # An answer to its question makes the first due at once, a cancel the second
    given = {"decision": "answer", "answer": {"ok": True}}
    assert await ledger.transact(lambda c: ledger.give_input(c, waits, "q1", given))
    assert await _orphans(ledger) == [waits]
    await ledger.transact(lambda c: ledger.request_cancel(c, works))
    assert sorted(await _orphans(ledger)) == sorted([waits, works])

    # A claim takes it up: its owner is the claimer and it is not parked any more
    claimed = await ledger.transact(lambda c: ledger.claim_orphan(c, waits, PARKED_PREFIX + "w1", "w9"))
    assert claimed is not None and claimed.owner == "w9" and claimed.wake_at is None
    assert claimed.handle == row.handle and claimed.inputs is not None

    # An answer given before the park is committed (or a cancel asked) makes it due at once
    assert await _park(ledger, waits, "w9", 3600, awaiting="q1")
    assert (await _get(ledger, waits)).wake_at <= datetime.now(UTC)  # type: ignore[operator]
    # A row that is not parked is not woken by an answer or a cancel: it has an owner at work
    other = await _execution(ledger, "w1", LedgerStatus.RUNNING)
    await ledger.transact(lambda c: ledger.request_cancel(c, other))
    assert (await _get(ledger, other)).wake_at is None


# ---- real processes ---------------------------------------------------------------------------


def pool(*mcp: str) -> list[str]:
    return [*hands(*mcp), "--concurrency", "1"]


async def submit(env: dict[str, str], agent_file: Path, session: str) -> str:
    args = ["-m", "brain", "submit", "--session", session, "--request-id", session]
    code, out, err = await run_cli([*args, "--agent", str(agent_file), "Go"], env)
    assert code == 0, err
    return out.strip()


def agent_in(tmp_path: Path, name: str, step: list[dict[str, Any]], tools: list[str]) -> Path:
    path = agent(tmp_path, [step], tools)
    definition = json.loads(path.read_text()) | {"name": f"park-{name}"}
    path.unlink()
    (tmp_path / f"{name}.json").write_text(json.dumps(definition))
    return tmp_path / f"{name}.json"


async def parked(obs: Observer, count: int) -> list[Any]:
    async def enough() -> list[Any] | None:
        rows = await obs.fetch(
            "SELECT * FROM {hands}.executions WHERE owner LIKE 'parked-by:%' AND open ORDER BY created_at"
        )
        return rows if len(rows) == count else None

    return await wait_for(enough, timeout=30, what=f"{count} parked execution(s)")


async def respond(env: dict[str, str], turn_id: str, call: str, *answer: str) -> None:
    code, out, err = await run_cli(["-m", "brain", "respond", turn_id, call, *answer, "--json"], env)
    assert code == 0, out + err


async def test_a_task_waiting_for_input_frees_the_only_slot_and_its_answer_takes_it_up(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    env = tendon.env
    await processes.start_ready("brain", BRAIN, env)
    await processes.start_ready("hands", pool(stdio(log)), env)
    obs = Observer(tendon)
    refund = await submit(
        env, agent_in(tmp_path, "a", [{"tool": "refund", "args": {"amount": 12}}], ["refund"]), "a"
    )
    (row,) = await parked(obs, 1)
    assert row["status"] == "running" and row["wake_at"] is not None
    assert json.loads(row["handle"])["mcp_task"] == calls(log, "refund")[0]["task"]

    # The pool's only slot is free: a call of another turn runs at once
    lookup = await submit(
        env, agent_in(tmp_path, "b", [{"tool": "lookup", "args": {"key": "k"}}], ["lookup"]), "b"
    )
    await obs.wait_turn(lookup, "completed", timeout=20)
    # And nothing polls the parked task
    polled = len(records(log, "get"))
    await asyncio.sleep(1.5)
    assert len(records(log, "get")) == polled, "a parked task is not polled"
    assert (await obs.turn(refund))["status"] == "waiting"

    # The answer takes it up at once (not at its wake time, a minute away)
    (waiting,) = await obs.executions(refund)
    await respond(env, refund, waiting["call_id"], "--result", '{"ok": true}')
    await obs.wait_turn(refund, "completed", timeout=20)
    (done,) = await obs.executions(refund)
    assert done["result"]["structuredContent"] == {"refunded": 12}
    assert len(calls(log, "refund")) == 1 and len(records(log, "update")) == 1


async def test_a_parked_task_whose_tool_was_listed_anew_meanwhile_is_followed_to_its_end(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    env = tendon.env
    await processes.start_ready("brain", BRAIN, env)
    await processes.start_ready("hands", pool(stdio(log)), env)
    obs = Observer(tendon)
    refund = await submit(
        env, agent_in(tmp_path, "a", [{"tool": "refund", "args": {"amount": 3}}], ["refund"]), "a"
    )
    await parked(obs, 1)
    step = [{"tool": "reshape", "args": {"refund_too": True}}]
    reshape = await submit(env, agent_in(tmp_path, "b", step, ["reshape"]), "b")
    await obs.wait_turn(reshape, "completed", timeout=20)

    async def relisted() -> bool:
        rows = await obs.fetch("SELECT binding FROM {brain}.bindings WHERE name = 'refund'")
        return len(rows) == 2

    await wait_for(relisted, timeout=20, what="refund to be announced anew")
    (waiting,) = await obs.executions(refund)
    await respond(env, refund, waiting["call_id"], "--result", '{"ok": true}')
    await obs.wait_turn(refund, "completed", timeout=20)
    (done,) = await obs.executions(refund)
    assert done["status"] == "succeeded", done["error"]
    assert done["result"]["structuredContent"] == {"refunded": 3}
    assert len(calls(log, "refund")) == 1


async def test_a_parked_task_survives_a_sigkill_its_answer_resumes_it_elsewhere_and_a_cancel_stops_it(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    url = await http_server(processes, log)  # outlives the Hands: its tasks are in its memory
    env = tendon.env
    await processes.start_ready("brain", BRAIN, env)
    first = await processes.start_ready("hands", pool(url), env)
    step = [{"tool": "refund", "args": {"amount": 7}}, {"tool": "refund", "args": {"amount": 9}}]
    turn_id = await submit(env, agent_in(tmp_path, "a", step, ["refund"]), "a")
    obs = Observer(tendon)
    # Both ask, though the pool runs one execution at a time: the first parked to free the slot
    rows = await parked(obs, 2)
    (old_owner,) = {r["owner"] for r in rows}

    first.send_signal(signal.SIGKILL)
    await processes.wait_exit(first)
    await processes.start_ready("hands", pool(url), env)
    yes, no = await obs.executions(turn_id)
    await respond(env, turn_id, yes["call_id"], "--result", '{"ok": true}')

    async def succeeded() -> Any:
        row = (await obs.executions(turn_id))[0]
        return row if row["status"] == "succeeded" else None

    yes = await wait_for(succeeded, timeout=20, what="the answered call to succeed on the new worker")
    assert yes["result"]["structuredContent"] == {"refunded": 7}
    (ledger_yes,) = await obs.fetch("SELECT owner FROM {hands}.executions WHERE execution_id = $1", yes["id"])
    assert ledger_yes["owner"] not in (old_owner, old_owner.removeprefix(PARKED_PREFIX))

    # The other is still parked; a cancel takes it up and stops its task on the server
    code, _, err = await run_cli(["-m", "brain", "cancel", turn_id], env)
    assert code == 0, err
    await obs.wait_turn(turn_id, "cancelled", timeout=20)
    _, no = await obs.executions(turn_id)
    assert no["status"] == "cancelled"
    tasks = {c["op"]: c["task"] for c in calls(log, "refund")}
    assert [r["op"] for r in records(log, "task_cancelled")] == [tasks[no["id"]]]
    (said,) = [e for e in await obs.hands_events(no["id"]) if e["kind"] == "cancelled"]
    assert "the server confirmed the cancel (tasks/cancel)" in said["body"]["reason"]
    assert len(calls(log, "refund")) == 2, "re-attached by their task ids, never called again"
    assert len(records(log, "update")) == 1


async def test_a_long_task_parks_past_the_poll_window_and_a_periodic_check_finds_it_done(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    log, gate = tmp_path / "calls.jsonl", tmp_path / "gate"
    env = {**tendon.env, "TENDON_MCP_PARK_AFTER": "0.3", "TENDON_MCP_CHECK_SECONDS": "2"}
    await processes.start_ready("brain", BRAIN, env)
    await processes.start_ready("hands", pool(stdio(log, gate)), env)
    obs = Observer(tendon)
    turn_id = await submit(
        env, agent_in(tmp_path, "a", [{"tool": "render", "args": {"pages": 3}}], ["render"]), "a"
    )
    (row,) = await parked(obs, 1)
    assert json.loads(row["handle"])["mcp_task"] == calls(log, "render")[0]["task"]
    other = await submit(
        env, agent_in(tmp_path, "b", [{"tool": "picture", "args": {"caption": "c"}}], ["picture"]), "b"
    )
    await obs.wait_turn(other, "completed", timeout=20)

    # Looked at again after 1 s, 2 s, 2 s...: a few polls, not one every 100 ms
    await asyncio.sleep(3.0)
    assert len(records(log, "get")) <= 6, records(log, "get")
    gate.touch()
    await obs.wait_turn(turn_id, "completed", timeout=20)
    (done,) = await obs.executions(turn_id)
    assert done["result"]["structuredContent"] == {"pages": 3}
    assert len(calls(log, "render")) == 1
