"""Durable waits on the embedded backend (SQLite, all in this process): the built-in tools sleep,
wait_for_signal and request_approval, answered by the Brain itself (the clock, a signal, a person)
with no Hands pool serving any of them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from brain import verbs
from brain.rules.agents import AgentDefinition
from brain.verbs import controls, signals
from brain.verbs.describe import describe
from infra.process.killpoints import KillPoints
from infra.process.settings import Settings
from infra.transport import Topology
from local.embedded import DataDir, LocalSystem, run_local
from local.testing import local_tendon
from protocol import ConflictError, SchemaError
from tests.support import wait_for

NS = "default"
SCAN = 0.2


@pytest.fixture
async def system(tmp_path: Path) -> AsyncIterator[LocalSystem]:
    settings = Settings(scan_interval=SCAN, reconnect_grace=0.5, lease_seconds=10, http="off")
    async with run_local(settings, DataDir(tmp_path / "data"), pools=[], killpoints=KillPoints()) as running:
        yield running


def agent(name: str, calls: list[dict[str, Any]], tools: list[str]) -> AgentDefinition:
    script = [{"tool_calls": calls}, {"content": "{results}"}]
    return AgentDefinition.model_validate(
        {"name": name, "version": "1", "tools": tools, "model": {"kind": "scripted", "script": script}}
    )


async def submit(system: LocalSystem, definition: AgentDefinition, request: str) -> str:
    turn_id, _ = await verbs.submit(
        system.brain, namespace=NS, session_id="s", request_id=request, user_input="go",
        agent=definition, wake_channel=system.wake_channel,
    )  # fmt: skip
    return turn_id


async def ended(system: LocalSystem, turn_id: str, timeout: float = 30) -> dict[str, Any]:
    async def reached() -> Any:
        d = await describe(system.brain, NS, turn_id)
        return d if d["status"] in ("completed", "failed", "cancelled") else None

    return await wait_for(reached, timeout=timeout, what=f"turn {turn_id} to end")


async def pending(system: LocalSystem, turn_id: str, count: int = 1) -> list[dict[str, Any]]:
    async def reached() -> Any:
        d = await describe(system.brain, NS, turn_id)
        found = [e for e in d["executions"] if e["status"] == "pending"]
        return found if len(found) == count else None

    return await wait_for(reached, timeout=30, what=f"{count} waiting call(s) of {turn_id}")


async def signal(system: LocalSystem, turn_id: str, key: str, payload: Any, request: str) -> Any:
    return await signals.signal(
        system.brain, namespace=NS, turn_id=turn_id, request_id=request, key=key, payload=payload,
        wake_channel=system.wake_channel,
    )  # fmt: skip


async def test_a_sleep_and_a_signal_timeout_are_answered_by_the_clock(system: LocalSystem) -> None:
    # Given a turn that sleeps 1 s and waits 1 s for a signal nobody sends, no Hands pool at all
    calls = [
        {"tool": "sleep", "args": {"seconds": 1}},
        {"tool": "wait_for_signal", "args": {"key": "x.never", "timeout": 1}},
    ]
    turn = await submit(system, agent("sleeper", calls, ["sleep", "wait_for_signal"]), "r")
    waits = await pending(system, turn, 2)
    assert {w["awaits"] for w in waits} == {"clock", "signal"}

    # Then the clock answers both, and the model reads what each became
    done = await ended(system, turn)
    assert done["status"] == "completed"
    rows = {e["tool"]: e for e in done["executions"]}
    assert (rows["sleep"]["status"], rows["sleep"]["how"]) == ("succeeded", "slept")
    assert rows["sleep"]["result"]["slept"] >= 1
    assert rows["wait_for_signal"]["how"] == "timed_out"
    assert rows["wait_for_signal"]["result"]["timed_out"] is True
    assert '"timed_out": true' in done["result"]["text"]


async def test_a_signal_wakes_its_wait_once_and_is_idempotent_by_request_id(system: LocalSystem) -> None:
    calls = [{"tool": "wait_for_signal", "args": {"key": "x.payment.done"}}]  # no timeout: forever
    turn = await submit(system, agent("payer", calls, ["wait_for_signal"]), "r")
    await pending(system, turn)

    # A signal of another key is kept for a later wait; a key outside x. is refused
    other = await signal(system, turn, "x.other", 1, "s0")
    assert other.status == "received"
    with pytest.raises(SchemaError):
        await signal(system, turn, "payment.done", 1, "s-bad")

    # When the signal comes, its payload is the call's result and the turn goes on
    sent = await signal(system, turn, "x.payment.done", {"amount": 5}, "s1")
    assert sent.status == "applied"
    done = await ended(system, turn)
    (row,) = done["executions"]
    assert (row["status"], row["how"]) == ("succeeded", "signalled")
    assert row["result"] == {"key": "x.payment.done", "payload": {"amount": 5}, "timed_out": False}

    # The same request again answers the same receipt; another input under it is a CONFLICT
    assert await signal(system, turn, "x.payment.done", {"amount": 5}, "s1") == sent
    with pytest.raises(ConflictError):
        await signal(system, turn, "x.payment.done", {"amount": 6}, "s1")
    late = await signal(system, turn, "x.payment.done", {"amount": 5}, "s2")
    assert late.status == "rejected"

    # ... and the signal no call waited for is rejected once the turn ended, saying so
    async def rejected() -> Any:
        found = {r.request_id: r for r in await controls.receipts(system.brain, namespace=NS, turn_id=turn)}
        return found["s0"] if found["s0"].status == "rejected" else None

    kept = await wait_for(rejected, timeout=10, what="the kept signal rejected")
    assert kept.reason == "its turn ended before a call waited for it"


async def test_a_signal_sent_before_its_wait_is_kept_and_answers_it(system: LocalSystem) -> None:
    # Given a turn that sleeps, then waits for x.early
    script = [
        {"tool_calls": [{"tool": "sleep", "args": {"seconds": 0.5}}]},
        {"tool_calls": [{"tool": "wait_for_signal", "args": {"key": "x.early", "timeout": 60}}]},
        {"content": "{results}"},
    ]
    definition = AgentDefinition.model_validate({"name": "early", "version": "1",
        "tools": ["sleep", "wait_for_signal"], "model": {"kind": "scripted", "script": script}})  # fmt: skip
    turn = await submit(system, definition, "r")
    await pending(system, turn)

    # When its signal comes while it still sleeps, it is kept
    kept = await signal(system, turn, "x.early", "first", "s1")
    assert kept.status == "received"

    # Then the wait that comes later gets it at once (within a scan), not after its timeout
    done = await ended(system, turn)
    waited = next(e for e in done["executions"] if e["tool"] == "wait_for_signal")
    assert (waited["how"], waited["result"]["payload"]) == ("signalled", "first")
    (receipt,) = await controls.receipts(system.brain, namespace=NS, turn_id=turn)
    assert (receipt.kind, receipt.status) == ("signal", "applied")


async def test_request_approval_is_answered_once_in_the_turns_namespace(system: LocalSystem) -> None:
    calls = [{"tool": "request_approval", "args": {"question": "refund 40 EUR?", "payload": {"order": 7}}}]
    turn = await submit(system, agent("asker", calls, ["request_approval"]), "r")
    (call,) = await pending(system, turn)
    assert call["awaits"] == "approval"

    async def respond(namespace: str, request: str) -> Any:
        return await controls.respond(
            system.brain, namespace=namespace, turn_id=turn, request_id=request, call=call["call_id"],
            decision="approve", wake_channel=system.wake_channel,
        )  # fmt: skip

    with pytest.raises(Exception, match="no turn"):  # another namespace does not see the turn
        await respond("elsewhere", "a0")
    assert (await respond(NS, "a1")).status == "applied"
    done = await ended(system, turn)
    (row,) = done["executions"]
    assert (row["status"], row["how"], row["result"]) == ("succeeded", "approved", {"approved": True})
    again = await respond(NS, "a2")  # used once
    assert again.status == "rejected"


async def test_signals_and_schedules_over_the_http_api(tmp_path: Path) -> None:
    calls = [{"tool": "wait_for_signal", "args": {"key": "x.go", "timeout": None}}]
    script = [{"tool_calls": calls}, {"content": "{results}"}]
    waiter = {"name": "waiter", "version": "1", "tools": ["wait_for_signal"],
              "model": {"kind": "scripted", "script": script}}  # fmt: skip
    async with local_tendon(tmp_path) as tendon:
        turn = await tendon.submit(waiter, "wait")
        await pending(tendon.system, turn)
        with pytest.raises(SchemaError):  # a key outside x. is a 422
            await tendon.client.signal(turn, "go", 1)
        sent = await tendon.client.signal(turn, "x.go", {"a": 1}, request_id="s1")
        assert (sent["kind"], sent["status"]) == ("signal", "applied")
        done = await tendon.wait(turn)
        assert done["executions"][0]["result"] == {"key": "x.go", "payload": {"a": 1}, "timed_out": False}

        ticker = {
            "name": "ticker",
            "version": "1",
            "model": {"kind": "scripted", "script": [{"content": "tick"}]},
        }
        made = await tendon.client.schedule("later", "once", "now", ticker, delay=0)

        async def fired() -> Any:
            (s,) = await tendon.client.schedules()
            return s if s["state"] == "done" else None

        done_schedule = await wait_for(fired, timeout=20, what="the schedule to fire")
        assert done_schedule["id"] == made["id"] and done_schedule["last_turn_id"]
        gone = await tendon.client.schedules("delete", made["id"])
        assert gone["state"] == "deleted"
        assert await tendon.client.schedules() == []


async def test_a_cancel_ends_a_sleeping_turn_at_once_and_the_clock_never_answers_it(
    system: LocalSystem,
) -> None:
    sleeper = agent("long-sleeper", [{"tool": "sleep", "args": {"seconds": 1}}], ["sleep"])
    turn = await submit(system, sleeper, "r")
    (call,) = await pending(system, turn)
    receipt = await controls.control(
        system.brain, namespace=NS, turn_id=turn, request_id="c", kind=controls.Kind.CANCEL,
        topology=Topology(Settings().queue_prefix), wake_channel=system.wake_channel,
    )  # fmt: skip
    assert receipt.status == "applied"
    done = await ended(system, turn)
    assert (done["status"], done["executions"][0]["status"]) == ("cancelled", "cancelled")

    # Its deadline went with it (the cancel cleared it), and the clock answers nothing
    async def cleared() -> Any:
        rows = await system.brain.read(
            lambda conn: conn.fetch("SELECT wait_until, status FROM executions WHERE id = $1", call["id"])
        )
        return rows[0]["wait_until"] is None and rows[0]["status"] == "cancelled"

    await wait_for(cleared, timeout=10, what="the deadline cleared")
    await asyncio.sleep(1.5)  # past the sleep's end, and a few scans
    entries = await system.brain.read(
        lambda conn: conn.fetch("SELECT facts FROM journal WHERE turn_id = $1", turn)
    )
    assert "execution.succeeded" not in [f["kind"] for e in entries for f in e["facts"]]
