"""The LangGraph API's own rules, without servers: what status a run shows for its turn, what a
``command.resume`` answers, how Tendon's messages read as LangChain's, and which parts a journal
entry makes in each stream mode."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from brain.api.langgraph.messages import Conversation, Parts, lc_message
from brain.models.base import Message
from brain.rules.langgraph import Answer, answers, run_status
from brain.rules.records import Entry
from protocol import IllegalTransitionError, SchemaError

APPROVAL = {"id": "call-1", "value": {"awaits": "approval", "tool": "send", "call_id": "call-1"}}
RESULT = {"id": "call-2", "value": {"awaits": "result", "tool": "ask", "call_id": "call-2"}}


@pytest.mark.parametrize(
    ("turn", "waits", "later", "status"),
    [
        (None, False, False, "pending"),
        ("queued", False, False, "pending"),
        ("running", False, False, "running"),
        ("waiting", False, False, "running"),
        ("paused", False, False, "running"),
        ("waiting", True, False, "success"),
        ("waiting", False, True, "success"),
        ("completed", False, False, "success"),
        ("failed", False, False, "error"),
        ("cancelled", False, False, "interrupted"),
        ("cancelled", False, True, "success"),
    ],
)
def test_a_run_shows_its_turns_status_and_success_where_it_stopped_at_an_interrupt(
    turn: str | None, waits: bool, later: bool, status: str
) -> None:
    assert run_status(turn, waits_for_person=waits, resumed_later=later) == status


@pytest.mark.parametrize(
    ("resume", "said"),
    [
        (True, Answer("call-1", "approve")),
        ("approve", Answer("call-1", "approve")),
        ({"decision": "APPROVE"}, Answer("call-1", "approve")),
        ({"type": "accept"}, Answer("call-1", "approve")),
        (False, Answer("call-1", "deny")),
        ({"decision": "deny", "reason": "not now"}, Answer("call-1", "deny", reason="not now")),
        ({"call-1": "deny"}, Answer("call-1", "deny")),
    ],
)
def test_a_resume_of_one_approval_is_its_answer(resume: Any, said: Answer) -> None:
    assert answers(resume, [APPROVAL]) == [said]


def test_a_manual_tools_interrupt_takes_the_resume_as_its_result() -> None:
    assert answers({"n": 1}, [RESULT]) == [Answer("call-2", "result", result={"n": 1})]
    assert answers({"result": [1]}, [RESULT]) == [Answer("call-2", "result", result=[1])]


def test_several_interrupts_take_answers_by_id_and_anything_else_is_refused_saying_why() -> None:
    both = [APPROVAL, RESULT]
    assert answers({"call-2": 5, "call-1": True}, both) == [
        Answer("call-2", "result", result=5),
        Answer("call-1", "approve"),
    ]
    with pytest.raises(SchemaError, match="2 interrupts wait"):
        answers(True, both)
    with pytest.raises(SchemaError, match="waits for an approval"):
        answers("maybe", [APPROVAL])
    with pytest.raises(IllegalTransitionError, match="no interrupt"):
        answers(True, [])


def test_tendons_messages_read_as_langchains() -> None:
    reply = Message(role="assistant", turn_id="t", content={"text": "hi", "tool_calls": [
        {"call_id": "c1", "tool": "greet", "args": {"name": "Ada"}}]})  # fmt: skip
    said = lc_message(reply, "t-2")
    assert (said["type"], said["content"], said["id"]) == ("ai", "hi", "t-2")
    assert said["tool_calls"] == [{"name": "greet", "args": {"name": "Ada"}, "id": "c1", "type": "tool_call"}]
    failed = Message(role="tool", turn_id="t", content={
        "call_id": "c1", "tool": "greet", "status": "cancelled", "result": None,
        "error": {"code": "cancelled", "message": "stop"}})  # fmt: skip
    said = lc_message(failed, "t-3")
    assert (said["type"], said["status"], said["tool_call_id"], said["name"]) == (
        "tool",
        "error",
        "c1",
        "greet",
    )
    assert "stop" in said["content"]
    steer = lc_message(Message(role="steer", turn_id="t", content={"text": "shorter"}), "t-4")
    assert (steer["type"], steer["additional_kwargs"]) == ("human", {"tendon_role": "steer"})


def entry(seq: int, turn: str, *facts: dict[str, Any]) -> Entry:
    return Entry("s", seq, "s", turn, 1, "running", "x", list(facts), datetime.now(UTC))


def test_an_entry_makes_the_parts_of_each_mode_and_a_rolled_back_turn_leaves_the_values() -> None:
    convo = Conversation("s")
    parts = Parts(["values", "updates", "messages-tuple", "events", "custom"], "run-1", "s")
    accepted = entry(
        1, "t1", {"kind": "turn.accepted", "input": {"text": "hello"}}, {"kind": "turn.prepared"}
    )
    said = parts.of(accepted, convo.add(accepted, {}), convo)
    assert [e for e, _ in said] == ["values"]  # an input is no node's update
    replied = entry(
        2, "t1", {"kind": "turn.model_replied", "message": {"text": "hi"}}, {"kind": "turn.completed"}
    )
    said = parts.of(replied, convo.add(replied, {}), convo)
    assert [e for e, _ in said] == ["values", "updates", "messages", "events", "custom"]
    assert said[2][1][1]["langgraph_node"] == "model" and said[4][1] == {"tendon": {"kind": "turn.completed"}}
    assert [m["id"] for m in convo.messages()] == ["t1-1", "t1-2"]
    rolled = entry(3, "t1", {"kind": "turn.rolled_back", "by": "t2"})
    assert convo.add(rolled, {}) == [] and convo.messages() == []
