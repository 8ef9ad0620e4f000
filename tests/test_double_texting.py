"""Double texting on both backends: a submit to a thread with an unfinished turn takes a strategy
(``brain.rules.doubletext``). A reject is refused and writes nothing; an interrupt cancels the
turns ahead in its own commit and closes their dispatched calls with their outcomes, so that the
conversation the model is sent has no call without its result; a rollback also takes the turns'
messages out of the conversation, their journal entries kept and marked; a known request id
answers its turn whatever the strategy, and interrupts nothing more."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from brain import AsyncClient, verbs
from brain.api import Api, Tokens
from brain.api.server import serving
from brain.models.openai_chat import chat_messages
from brain.rules import facts
from brain.rules.history import ThreadHistory, needed_executions
from brain.rules.records import Entry
from brain.rules.submits import Submit
from brain.rules.words import said
from brain.store import BrainStore
from brain.verbs import controls
from infra.transport import Topology
from protocol import ConflictError, SchemaError
from tests.support import run_cli
from tests.test_brain_store import AGENT, AGENT_DEF, _facts, _submit, _turn, _waiting_on, pg_store, store

__all__ = ["pg_store", "store"]  # the fixtures, used by name


async def _submit_with(store: BrainStore, request_id: str, strategy: str, text: str = "go") -> Any:
    return await verbs.submit(
        store, namespace="ns", session_id="s1", request_id=request_id, user_input=text, agent=AGENT,
        wake_channel="wake", strategy=strategy, topology=Topology("t"),
    )  # fmt: skip


async def conversation(store: BrainStore, thread_id: str = "ns/s1") -> list[dict[str, Any]]:
    """What the model of ``thread_id`` would be sent now, as the chat-completions adapter writes it."""

    async def read(conn: Any) -> ThreadHistory:
        entries = await store.journal.entries(conn, "ns/s1", limit=100_000)
        executions = await store.executions.executions_by_id(conn, needed_executions(entries))
        history = ThreadHistory()
        history.extend(entries, executions, thread_id)
        return history

    return chat_messages("", (await store.read(read)).messages)


def dangling(messages: list[dict[str, Any]]) -> list[str]:
    """The tool calls of ``messages`` that no tool message answers before the next other message."""
    left: list[str] = []
    for m in messages:
        if m["role"] == "tool" and m["tool_call_id"] in left:
            left.remove(m["tool_call_id"])
        elif left:
            return left
        if m["role"] == "assistant":
            left = [c["id"] for c in m.get("tool_calls", [])]
    return left


async def test_a_reject_refuses_a_busy_thread_and_a_known_request_still_answers_its_turn(store):
    # Given a thread with an unfinished (queued) turn
    first = await _submit(store, "r1")
    # When a new request comes with reject: refused, nothing written
    with pytest.raises(ConflictError, match="busy .* reject"):
        await _submit_with(store, "r2", "reject")
    assert await _facts(store) == [(1, ["turn.accepted"])]
    # A request id that made a turn answers it, busy or not
    assert await _submit_with(store, "r1", "reject", text="hello") == (first, False)
    # An enqueue (the default) waits behind the busy turn, which goes on
    queued, _ = await _submit_with(store, "r1e", "enqueue")
    assert [(await _turn(store, t)).status for t in (first, queued)] == ["queued", "queued"]
    await controls.control(
        store, namespace="ns", turn_id=queued, request_id="c", kind=controls.Kind.CANCEL,
        topology=Topology("t"), wake_channel="wake",
    )  # fmt: skip
    # Once the thread is idle, a reject is accepted like any submit
    await controls.control(
        store, namespace="ns", turn_id=first, request_id="c", kind=controls.Kind.CANCEL,
        topology=Topology("t"), wake_channel="wake",
    )  # fmt: skip
    turn, created = await _submit_with(store, "r3", "reject")
    assert created and (await _turn(store, turn)).status == "queued"
    with pytest.raises(SchemaError, match="one of reject, enqueue, interrupt, rollback"):
        await _submit_with(store, "r4", "later")


async def test_an_interrupt_cancels_the_turn_ahead_and_closes_its_two_calls_so_none_dangles(store):
    # Given a turn waiting on two calls that no Hands worker accepted yet
    first = await _submit(store, "r1", text="first")
    await _waiting_on(store, first, "e1", "e2")
    # When a new message interrupts it: one commit cancels it and queues the new turn
    second, created = await _submit_with(store, "r2", "interrupt", text="second")
    assert created
    assert [(await _turn(store, t)).status for t in (first, second)] == ["cancelled", "queued"]
    (receipt,) = await controls.receipts(store, namespace="ns", turn_id=first)
    assert (receipt.kind, receipt.request_id, receipt.status) == ("cancel", f"interrupt:{second}", "applied")
    assert receipt.reason == f"interrupted by a new message (turn {second})"
    # Then the interrupted turn's work stays in the conversation, each call closed with its outcome
    # (cancelled, with why), and the new input follows
    messages = await conversation(store)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert dangling(messages) == []
    closed = [m["content"] for m in messages if m["role"] == "tool"]
    assert all('"status": "cancelled"' in c and "interrupted by a new message" in c for c in closed)
    # The same request again answers the same turn and cancels nothing more
    assert await _submit_with(store, "r2", "interrupt", text="second") == (second, False)
    assert len(await controls.receipts(store, namespace="ns", turn_id=first)) == 1


async def test_a_rollback_takes_the_turn_ahead_out_of_the_conversation_and_keeps_its_entries_marked(store):
    # Given a turn waiting on a call
    first = await _submit(store, "r1", text="first")
    await _waiting_on(store, first, "e1")
    assert [m["role"] for m in await conversation(store)] == ["user", "assistant"]
    # When a new message rolls it back
    second, _ = await _submit_with(store, "r2", "rollback", text="second")
    # Then nothing of it reaches the model; its entries stay, the last one marked
    assert await conversation(store) == []
    entries = await store.read(lambda c: store.journal.entries(c, "ns/s1"))
    kinds = [f["kind"] for e in entries for f in e.facts]
    assert kinds.count("turn.model_replied") == 1
    (mark,) = [(e.turn_id, f) for e in entries for f in e.facts if f["kind"] == "turn.rolled_back"]
    assert mark[0] == first and said(mark[1]) == f"rolled back by turn {second}: out of the conversation"
    assert (await _turn(store, first)).status == "cancelled"
    (receipt,) = await controls.receipts(store, namespace="ns", turn_id=first)
    assert receipt.request_id == f"rollback:{second}"
    # The same request again answers the same turn, and an enqueue of it too
    assert await _submit_with(store, "r2", "rollback", text="second") == (second, False)
    assert await _submit_with(store, "r2", "enqueue", text="second") == (second, False)
    assert len(await controls.receipts(store, namespace="ns", turn_id=first)) == 1


async def test_the_api_its_client_and_the_cli_take_the_strategy(store, tmp_path):
    api = Api(store=store, tokens=Tokens("", "", "ns"), topology=Topology("t"), wake_channel="wake")
    async with serving(api, ("127.0.0.1", 0), required=True) as port:
        url = f"http://127.0.0.1:{port}"
        async with AsyncClient(url) as client:
            # Given a thread with an unfinished turn
            first = await client.submit("s1", "r1", "first", AGENT_DEF)
            # a reject is a 409 conflict, a strategy it does not know a 422, and neither writes
            with pytest.raises(ConflictError, match="busy"):
                await client.submit("s1", "r2", "second", AGENT_DEF, multitask_strategy="reject")
            with pytest.raises(SchemaError, match="multitask_strategy"):
                await client.submit("s1", "r2", "second", AGENT_DEF, multitask_strategy="later")
            path = tmp_path / "agent.json"
            path.write_text(json.dumps(AGENT_DEF))
            code, _, err = await run_cli(
                ["-m", "brain", "submit", "--url", url, "--session", "s1", "--request-id", "r2",
                 "--agent", str(path), "--if-busy", "reject", "second"], {},
            )  # fmt: skip
            assert code == 4 and "busy" in err
            # an interrupt takes the thread: the turn ahead is cancelled, the new one queued
            made = await client.submitted("s1", "r2", "second", AGENT_DEF, multitask_strategy="interrupt")
            assert made["created"] and (await client.turn(first))["status"] == "cancelled"
            # and the same request answers the same turn, whatever strategy it names now
            again = await client.submitted("s1", "r2", "second", AGENT_DEF, multitask_strategy="reject")
            assert (again["turn_id"], again["created"]) == (made["turn_id"], False)


def test_a_call_whose_turn_ended_before_its_execution_was_committed_is_closed_as_never_sent() -> None:
    # Given a reply with two calls committed, then its turn cancelled before they were dispatched
    # (a run that resumed at dispatch_tools), then another turn: the history alone closes them
    reply = {
        "text": None,
        "tool_calls": [{"call_id": "c1", "tool": "echo"}, {"call_id": "c2", "tool": "echo"}],
    }
    said = [
        ("t1", [facts.accepted("r1", "first"), facts.prepared()]), ("t1", [facts.model_replied(reply, {})]),
        ("t1", [facts.cancelled_turn()]), ("t2", [facts.accepted("r2", "second"), facts.prepared()]),
    ]  # fmt: skip
    history = ThreadHistory()
    history.extend(
        [Entry("s", n, "s", t, None, None, None, f, None) for n, (t, f) in enumerate(said, 1)], {}, "s"
    )
    messages = chat_messages("", history.messages)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "user"]
    assert dangling(messages) == []
    never = "its turn was cancelled before this call was sent to its tool"
    assert json.loads(messages[2]["content"]) == {
        "status": "cancelled",
        "error": {"code": "not_sent", "message": never},
    }


async def test_a_reject_waits_for_a_submit_holding_the_thread_and_sees_its_turn(pg_store):
    # Given an idle thread, and a submit that holds its lock, not committed yet
    first = await _submit(pg_store, "r0")
    await controls.control(
        pg_store, namespace="ns", turn_id=first, request_id="c", kind=controls.Kind.CANCEL,
        topology=Topology("t"), wake_channel="wake",
    )  # fmt: skip
    holding = asyncio.Event()

    async def hold(conn: Any) -> Any:
        asked = Submit("ns", "s1", "r1", "go", AGENT, "wake")
        done = await pg_store.submits.submit_in(conn, asked, None)
        holding.set()
        await asyncio.sleep(0.5)
        return done

    held = asyncio.create_task(pg_store.transact(hold, read_then_insert=True))
    await holding.wait()
    # When a reject comes meanwhile: it waits, and counts the turn that committed while it waited
    with pytest.raises(ConflictError, match="busy"):
        await _submit_with(pg_store, "r2", "reject")
    assert (await held).created


def test_an_interrupt_of_a_turn_mid_model_call_waits_for_its_boundary_and_other_cancels_do_not() -> None:
    from dataclasses import replace

    from brain.rules.controls import Kind, Outcome, TurnView, decide
    from brain.rules.states import TurnStatus

    mid_call = TurnView(
        status=TurnStatus.RUNNING, leased=True, revision=4, accepted_executions=0, cancelling=False,
        pause_pending=False,
    )  # fmt: skip
    assert decide(Kind.CANCEL, mid_call, {"strategy": "interrupt", "by": "t2"}) == (Outcome.DEFER, None)
    assert decide(Kind.CANCEL, mid_call, {"strategy": "rollback", "by": "t2"}) == (Outcome.APPLY, None)
    assert decide(Kind.CANCEL, mid_call, {}) == (Outcome.APPLY, None)
    waiting = replace(mid_call, status=TurnStatus.WAITING, leased=False)
    assert decide(Kind.CANCEL, waiting, {"strategy": "interrupt", "by": "t2"}) == (Outcome.APPLY, None)
