"""The rules of a person's input to an MCP task, without servers: what the Brain makes of an
``input_required`` event, and what the Hands send the server (``tasks/update``) for an answer."""

from __future__ import annotations

from typing import Any

import pytest

from brain.rules.applying import Execution, effect
from brain.rules.states import ExecutionStatus
from hands.tools.mcp_tasks import TaskState, question, responses
from protocol import InputBody, InputRequiredBody, InputRequiredEvent, decode, encode
from tests.test_brain_store import _header

ELICIT = {"method": "elicitation/create", "params": {"message": "Refund 5 EUR?", "requestedSchema": {}}}
SAMPLE = {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 10}}


def test_an_input_required_event_asks_without_moving_the_status() -> None:
    body = InputRequiredBody(key="t1/abc", message="Refund 5 EUR?", requests={"confirm": ELICIT})
    event = InputRequiredEvent(seq=3, body=body, **_header("e1"))
    done = effect(ExecutionStatus.RUNNING, [decode(encode(event))], Execution("e1", "call_1", "refund"))
    assert done.status is ExecutionStatus.RUNNING and not done.terminal and done.last_seq == 3
    assert done.asked == {"key": "t1/abc", "message": "Refund 5 EUR?", "requests": {"confirm": ELICIT}}
    assert [f["kind"] for f in done.facts] == ["execution.input_required"]


def test_an_answer_is_an_accepted_elicitation_and_a_denial_declines_each_request() -> None:
    one = {"confirm": ELICIT}
    assert responses(one, {"decision": "answer", "answer": {"ok": True}}) == {
        "confirm": {"action": "accept", "content": {"ok": True}}
    }
    # An answer that is an elicitation result already goes as it is.
    assert responses(one, {"decision": "answer", "answer": {"action": "cancel"}}) == {
        "confirm": {"action": "cancel"}
    }
    two = {"a": ELICIT, "b": ELICIT}
    assert responses(two, {"decision": "decline"}) == {"a": {"action": "decline"}, "b": {"action": "decline"}}
    # Several requests: an answer keyed like them answers each; any other answers all of them.
    keyed: dict[str, Any] = {"a": {"ok": True}, "b": {"ok": False}}
    assert responses(two, {"decision": "answer", "answer": keyed}) == {
        "a": {"action": "accept", "content": {"ok": True}},
        "b": {"action": "accept", "content": {"ok": False}},
    }
    assert responses(two, {"decision": "answer", "answer": 7})["b"] == {"action": "accept", "content": 7}
    # A sampling request's answer is its result as the person gave it.
    reply = {"role": "assistant", "content": {"type": "text", "text": "hi"}, "model": "m"}
    assert responses({"s": SAMPLE}, {"decision": "answer", "answer": reply}) == {"s": reply}


def test_the_question_a_person_sees_is_the_elicitations_message() -> None:
    state = TaskState.model_validate(
        {"taskId": "t", "status": "input_required", "inputRequests": {"a": ELICIT, "s": SAMPLE}}
    )
    assert question(state) == "Refund 5 EUR?"
    bare = TaskState.model_validate(
        {"taskId": "t", "status": "input_required", "statusMessage": "need a hand"}
    )
    assert question(bare) == "need a hand"


def test_an_answer_names_its_question_and_is_an_answer_or_a_decline() -> None:
    with pytest.raises(ValueError):
        InputBody(key="", decision="answer", request_id="r")
    with pytest.raises(ValueError):
        InputBody(key="k", decision="approve", request_id="r")  # type: ignore[arg-type]


def test_the_same_question_asked_again_after_its_answer_was_taken_is_a_new_round() -> None:
    from hands.tools.mcp import _Questions

    asked = _Questions()
    assert asked.key("t/q") == "t/q"
    asked.sent.add("t/q")  # answered (tasks/update)
    assert asked.key("t/q") is None, "not taken yet: nothing to ask or send"
    asked.moved = True  # the task went on, then asks the same again
    assert asked.key("t/q") == "t/q#1", "asked of the person again, not answered with the old answer"
    assert asked.key("t/q") == "t/q#1"
    asked.sent.add("t/q#1")
    asked.moved = False
    assert asked.key("t/q") is None
    assert asked.key("t/other") == "t/other"
