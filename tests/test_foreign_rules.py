"""The rules of framework agents (kind python), without servers: their definitions, where their
tools go, the replay check, the moves of their replies and output, and the history a Pydantic AI
agent is given of the thread's earlier turns."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from brain.models.base import Message
from brain.rules import foreign
from brain.rules.admission import check_model
from brain.rules.agents import AgentDefinition
from brain.rules.states import TurnPhase, TurnStatus
from protocol import SchemaError
from tests.test_agent_rules import _row

PYTHON = {"name": "support", "version": "3", "framework": "pydantic-ai", "agent": "myapp.agents:support"}


def test_a_framework_agent_needs_no_model_and_a_json_agent_still_does() -> None:
    agent = AgentDefinition.model_validate({**PYTHON, "tools": ["send_email"], "local_tools": ["fmt"]})
    assert agent.foreign and agent.model == {} and agent.local_tools == ["fmt"]
    with pytest.raises(ValidationError, match="`model` is required"):
        AgentDefinition.model_validate({"name": "a", "version": "1"})


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"agent": None}, "go together"),
        ({"framework": None}, "go together"),
        ({"model": {"kind": "scripted"}}, "its own model"),
        ({"tools": ["t"], "local_tools": ["t"]}, "both local"),
        ({"agent": "no-colon"}, "pattern"),
        ({"framework": "langgraph"}, "pydantic-ai"),
    ],
)
def test_a_framework_agent_definition_that_cannot_run_is_refused_saying_why(
    change: dict[str, Any], said: str
) -> None:
    spec = {k: v for k, v in {**PYTHON, **change}.items() if v is not None}
    with pytest.raises(ValidationError, match=said):
        AgentDefinition.model_validate(spec)


def test_the_new_fields_leave_the_digest_of_an_older_definition_as_it_was() -> None:
    old = {"name": "a", "version": "1", "model": {"kind": "scripted"}}
    # as the Brain digested it before kind python existed (threads pinned to it keep it)
    assert AgentDefinition.model_validate(old).digest.startswith("18d02bc806870ab07cb135a50ec24fe3")
    python = AgentDefinition.model_validate(PYTHON)
    assert python.digest != AgentDefinition.model_validate({**PYTHON, "agent": "myapp.agents:other"}).digest


def test_admission_takes_an_installed_framework_and_names_the_extra_of_a_missing_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check_model(AgentDefinition.model_validate(PYTHON))  # installed here (the dev extra)
    monkeypatch.setitem(
        __import__("brain.rules.admission", fromlist=["x"]).FRAMEWORK_PACKAGES,
        "pydantic-ai",
        ("not_a_package_here", "pydantic-ai"),
    )
    with pytest.raises(SchemaError, match=r"pip install 'tendon\[pydantic-ai\]'"):
        check_model(AgentDefinition.model_validate(PYTHON))


def test_a_replay_that_asks_the_same_passes_and_one_that_asks_otherwise_names_the_call_and_the_rule() -> None:
    same = foreign.asked({"messages": [{"content": "hi"}], "tools": ["a"]})
    assert (
        foreign.diverged("support", 2, same, foreign.asked({"tools": ["a"], "messages": [{"content": "hi"}]}))
        is None
    )
    error = foreign.diverged("support", 2, same, foreign.asked({"messages": [{"content": "hi at 10:02"}]}))
    assert error is not None and error.code == "replay_diverged" and not error.retryable
    assert "model call 2" in error.message and "deterministic between model calls" in error.message


def test_every_tool_of_the_agent_must_be_placed_in_tools_or_local_tools() -> None:
    assert foreign.unplaced_tools("a", {"send": 1, "fmt": 1}, ["send"], ["fmt"]) is None
    error = foreign.unplaced_tools("a", {"send": 1, "fmt": 1, "rm": 1}, ["send"], [])
    assert error is not None and "fmt, rm" in error.message and "local_tools" in error.message


def test_a_reply_without_hands_calls_keeps_the_turn_running_and_the_output_completes_it() -> None:
    row = _row()
    went = foreign.went_on(row, {"text": "thinking"}, {"total_tokens": 3}, {"number": 2})
    assert (went.status, went.phase, went.model_calls) == (TurnStatus.RUNNING, TurnPhase.MODEL_REQUEST, 2)
    assert went.facts[0]["kind"] == "turn.model_replied" and not went.release
    done = foreign.finished(row, '{"value": 42}', {"value": 42})
    assert (done.status, done.phase, done.release) == (TurnStatus.COMPLETED, TurnPhase.DONE, True)
    assert done.result == {"text": '{"value": 42}', "output": {"value": 42}}
    assert foreign.finished(row, "hi", "hi").result == {"text": "hi"}


def test_usage_is_kept_in_tendons_terms() -> None:
    assert foreign.usage_of(11, 7) == {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    assert foreign.usage_of(None, None)["total_tokens"] == 0


def test_a_pydantic_ai_agent_gets_the_earlier_turns_with_their_hands_calls_and_outcomes() -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai.messages import (
        ModelMessagesTypeAdapter,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
    )

    from brain.frameworks.pydanticai import history_of

    response = ModelResponse(
        parts=[
            TextPart(content="on it"),
            ToolCallPart("send_email", '{"to": "a"}', "fw-1"),
            ToolCallPart("fmt", "{}", "fw-2"),
        ]
    )
    kept = ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]
    framework = {"name": "pydantic-ai", "response": kept, "asked": "x", "calls": {"fw-1": "call-1"}}
    calls = [{"call_id": "call-1", "tool": "send_email", "args": {"to": "a"}}]
    reply = {"text": "on it", "tool_calls": calls, "framework": framework}
    outcome = {
        "call_id": "call-1",
        "tool": "send_email",
        "status": "succeeded",
        "result": {"id": 1},
        "error": None,
    }
    prior = [
        Message(role="user", turn_id="t0", content={"text": "send it"}),
        Message(role="assistant", turn_id="t0", content=reply),
        Message(role="tool", turn_id="t0", content=outcome),
        Message(role="assistant", turn_id="t0", content={"text": "sent"}),
    ]
    got = history_of(prior)
    assert [type(m) for m in got] == [ModelRequest, ModelResponse, ModelRequest, ModelResponse]
    assert [p.part_kind for p in got[1].parts] == ["text", "tool-call"]  # the local call is left out
    assert got[2].parts[0].tool_call_id == "fw-1" and got[2].parts[0].content == {"id": 1}


def test_an_agent_is_imported_only_from_the_allowed_modules_and_a_bad_path_says_what_is_wrong() -> None:
    from brain.frameworks import load

    with pytest.raises(SchemaError, match=r"only from examples, myapp \(TENDON_AGENT_MODULES\)"):
        load("tests.fw_pydantic_agents:notice", ("examples", "myapp"))
    assert load("json:dumps", ("json",)) is __import__("json").dumps  # a module and its submodules
    with pytest.raises(SchemaError, match="cannot be imported"):
        load("no_such_module_here:agent")
    with pytest.raises(SchemaError, match="module json has no nothing"):
        load("json:nothing")


def test_an_agents_sdk_agent_gets_the_earlier_turns_with_their_hands_calls_and_outputs() -> None:
    pytest.importorskip("agents")
    from brain.frameworks.openaiagents import history_of

    output = [
        {"type": "message", "role": "assistant", "id": "m1", "status": "completed",
         "content": [{"type": "output_text", "text": "on it", "annotations": []}]},
        {"type": "function_call", "call_id": "fw-1", "name": "send_email", "arguments": '{"to": "a"}'},
        {"type": "function_call", "call_id": "fw-2", "name": "fmt", "arguments": "{}"},
    ]  # fmt: skip
    framework = {"name": "openai-agents", "response": {"output": output, "usage": {}}, "asked": "x",
                 "calls": {"fw-1": "call-1"}}  # fmt: skip
    outcome = {
        "call_id": "call-1",
        "tool": "send_email",
        "status": "succeeded",
        "result": {"id": 1},
        "error": None,
    }
    prior = [
        Message(role="user", turn_id="t0", content={"text": "send it"}),
        Message(role="assistant", turn_id="t0", content={"text": "on it", "framework": framework}),
        Message(role="tool", turn_id="t0", content=outcome),
        Message(role="assistant", turn_id="t0", content={"text": "sent"}),
    ]
    got = history_of(prior)
    assert [i.get("type") or i["role"] for i in got] == [
        "user", "message", "function_call", "function_call_output", "assistant"
    ]  # fmt: skip
    assert got[3] == {"type": "function_call_output", "call_id": "fw-1", "output": '{"id": 1}'}


def test_a_dispatch_that_resumes_a_framework_reply_keeps_the_approvals_the_framework_flagged() -> None:
    agent = AgentDefinition.model_validate({**PYTHON, "tools": ["send", "wire"], "approvals": ["wire"]})
    flagged = {"text": None, "framework": {"name": "pydantic-ai", "approvals": ["send"]}}
    assert foreign.approvals(agent, flagged) == ["wire", "send"]
    assert foreign.approvals(agent, {"text": "plain"}) == ["wire"]
