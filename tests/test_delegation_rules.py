"""The rules of delegation, without servers: what a definition may declare, what the model sees of
a delegate, how a call of one waits, which chains are cycles, when a budget is spent, and what a
child's end makes of its parent's call."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from brain.face.render import print_history
from brain.rules import delegation as rules
from brain.rules import facts
from brain.rules.admission import check_model, unknown_tools
from brain.rules.agents import AgentDefinition
from brain.rules.moves import intents_reason
from brain.rules.words import said
from brain.run.claims import offered
from brain.store.sql import delegation_becomes
from protocol import IllegalTransitionError, SchemaError


def sub(name: str = "researcher", **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "version": "1",
        "model": {"kind": "scripted", "script": [{"content": "x"}]},
        **fields,
    }


def lead(**delegate: Any) -> AgentDefinition:
    return AgentDefinition.model_validate(sub("lead", delegates={"research": {"agent": sub(), **delegate}}))


def test_a_definition_declares_delegates_and_refuses_what_cannot_work() -> None:
    agent = lead(thread="notes", budget={"model_calls": 3, "seconds": 60}, on_budget="partial")
    d = agent.delegates["research"]
    assert (d.agent.name, d.thread, d.budget.model_calls, d.budget.tokens) == ("researcher", "notes", 3, None)
    for bad in ({"thread": "no spaces"}, {"on_budget": "retry"}, {"budget": {"model_calls": 0}},
                {"budget": {"minutes": 1}}):  # fmt: skip
        with pytest.raises(ValidationError):
            lead(**bad)
    with pytest.raises(ValidationError, match="a tool already"):
        AgentDefinition.model_validate(
            sub("lead", tools=["research"], delegates={"research": {"agent": sub()}})
        )


def test_a_definition_without_delegates_keeps_its_digest() -> None:
    plain = AgentDefinition.model_validate(sub("lead"))
    assert plain.digest == AgentDefinition.model_validate(sub("lead", delegates={})).digest
    assert plain.digest != lead().digest


def test_the_model_sees_a_delegate_as_a_tool_with_one_input_and_the_thread_freezes_it() -> None:
    agent = lead()
    binding = agent.delegates["research"].binding("research")
    assert (binding["route"], binding["delegate"], binding["input_schema"]["required"]) == (
        "brain",
        True,
        ["input"],
    )
    bindings, missing = offered(agent, {})
    assert bindings["research"] == binding and missing == []
    other = AgentDefinition.model_validate(
        sub("lead", delegates={"research": {"agent": sub(instructions="new")}})
    )
    assert other.delegates["research"].binding("research")["digest"] != binding["digest"]  # pins the child


def test_a_delegated_call_is_pending_until_its_child_ends_and_sends_nothing() -> None:
    binding = lead().delegates["research"].binding("research")
    call = {"call_id": "call-1", "tool": "research", "args": {"input": "look"}}
    intent = rules.delegate_intent("exe-1", 1, call, binding, detailed=False)
    assert (intent.status, intent.awaits, intent.how, intent.wait_key) == (
        "pending", "child", rules.AWAITING, rules.TO_START,
    )  # fmt: skip
    assert not intent.sends and intent.command is None
    assert intents_reason([intent]) == "a child turn for research call-1"
    assert rules.child_thread(lead().delegates["research"], "exe-1") == "d-exe-1"
    assert rules.child_thread(lead(thread="notes").delegates["research"], "exe-1") == "notes"
    assert rules.child_request("exe-1") == "delegate:exe-1"


def test_a_chain_that_comes_back_to_a_thread_or_an_agent_is_a_cycle() -> None:
    chain = [{"thread": "ns/s", "thread_name": "main", "agent": "lead"},
             {"thread": "ns/s/d-1", "thread_name": "d-1", "agent": "researcher"}]  # fmt: skip
    assert rules.cycle(chain, "ns/s/d-2", "writer") is None
    assert "thread 'main' would wait on itself" in (rules.cycle(chain, "ns/s", "writer") or "")
    assert "lead -> researcher -> lead" in (rules.cycle(chain, "ns/s/d-2", "lead") or "")
    assert "agent researcher delegates to itself" in (rules.cycle(chain, "ns/s/d-3", "researcher") or "")


def replied(calls: int = 0, **usage: int) -> dict[str, Any]:
    message = {"text": "t", "tool_calls": [{"call_id": f"c{i}"} for i in range(calls)]}
    return {"kind": "turn.model_replied", "message": message, "usage": usage}


def test_what_a_child_spent_and_when_its_budget_is_spent() -> None:
    said = [
        replied(2, prompt_tokens=10, completion_tokens=5),
        {"kind": "turn.prepared"},
        replied(1, total_tokens=30),
    ]
    used = rules.used(said)
    assert used == {"model_calls": 2, "tool_calls": 3, "tokens": 45}
    assert rules.spent(rules.Budget(), used, 10**6) is None
    assert rules.spent(rules.Budget(model_calls=3, tool_calls=4, tokens=46, seconds=5), used, 4.9) is None
    assert "2 model calls" in (rules.spent(rules.Budget(model_calls=2), used, 0) or "")
    assert "3 tool calls" in (rules.spent(rules.Budget(tool_calls=3), used, 0) or "")
    assert "45 tokens" in (rules.spent(rules.Budget(tokens=45), used, 0) or "")
    assert "5 seconds" in (rules.spent(rules.Budget(seconds=5), used, 5.0) or "")
    assert rules.tokens({"input_tokens": 3, "output_tokens": 4}) == 7


def test_a_childs_end_is_its_parents_result() -> None:
    assert rules.answer("completed", {"text": "hi"}, None) == ("succeeded", "delegated", {"text": "hi"}, None)
    partial = rules.partial_result("so far", "its budget of 2 model calls is spent")
    assert rules.answer("completed", partial, None)[:2] == ("succeeded", "partial")
    status, how, result, error = rules.answer("failed", None, {"code": "x", "message": "boom"})
    assert (status, result, error["code"]) == ("failed", None, "child_failed") and "boom" in error["message"]
    assert rules.answer("cancelled", None, None)[3]["code"] == "child_cancelled"
    rows = [{"tool": "sleep", "call_id": "call-1", "status": "cancelled", "result": None}]
    late = rules.answer("cancelled", None, None, stopped="its time budget is spent", on_budget="partial",
                        last_text="half", executions=rows)  # fmt: skip
    assert (
        late[:2] == ("succeeded", "partial")
        and late[2]["text"] == "half"
        and late[2]["results"][0]["tool"] == "sleep"
    )
    failed = rules.answer("cancelled", None, None, stopped="its time budget is spent")
    assert failed[0] == "failed" and failed[3]["code"] == "limit_reached"
    said = [replied(0), {"kind": "turn.model_replied", "message": {"text": ""}, "usage": {}}]
    assert rules.last_text(said) == "t" and rules.last_text([]) is None


def test_a_submit_checks_its_delegates_tools_and_models_too() -> None:
    child = sub(tools=["search", "fetch"], expect_tools=["fetch"])
    agent = AgentDefinition.model_validate(sub("lead", tools=["read"], delegates={"r": {"agent": child}}))
    assert unknown_tools(agent, {"read"}, expect=False) == ["search"]
    assert unknown_tools(agent, {"read", "search"}, expect=False) == []
    odd = AgentDefinition.model_validate(
        sub("lead", delegates={"r": {"agent": {**sub(), "model": {"kind": "x"}}}})
    )
    with pytest.raises(SchemaError, match="agent researcher names model kind 'x'"):
        check_model(odd)


def test_the_delegation_facts_say_in_words_what_happened() -> None:
    call = {"execution_id": "exe-1", "call_id": "call-1", "tool": "research"}
    child = {
        "child_turn": "turn-9",
        "child_thread": "d-exe-1",
        "agent": {"name": "researcher", "version": "1"},
    }
    assert said(facts.delegated("exe-1", "call-1", "research", child)) == (
        "research (call-1) started child turn turn-9 of agent researcher in thread d-exe-1"
    )
    spent = {"model_calls": 2, "tool_calls": 0, "tokens": 30}
    assert "child turn turn-9 completed (2 model calls" in said(
        facts.tool_delegated("exe-1", "call-1", "research", "turn-9", "completed", spent)
    )
    asked = said(facts.child_cancel_requested("exe-1", "turn-9", 4, "its parent's call was cancelled"))
    assert asked == "a cancel was asked of child turn turn-9 (control #4): its parent's call was cancelled"
    partial = said({"kind": "execution.succeeded", **call, "how": "partial"})
    assert "when its budget was spent" in partial
    assert {"turn.delegated", "tool.delegated", "tool.child_cancel_requested"} <= set(facts.KINDS)


def test_a_development_server_versions_the_delegates_by_content_too() -> None:
    edited = AgentDefinition.model_validate(sub("lead", delegates={"r": {"agent": sub(instructions="new")}}))
    original, changed = lead().versioned_by_content(), edited.versioned_by_content()
    first, second = original.delegates["research"].agent, changed.delegates["r"].agent
    assert (
        first.version.startswith("1+") and second.version.startswith("1+") and first.version != second.version
    )
    assert lead().versioned_by_content() == original  # the same content, the same versions


def test_brain_history_prints_each_child_and_the_sum(capsys: pytest.CaptureFixture[str]) -> None:
    leaf = {"tool": "write", "call_id": "call-1", "agent": {"name": "writer"}, "child_turn": "turn-3",
            "child_thread": "d-exe-2", "child_status": "completed", "status": "settled", "reason": None,
            "usage": {"model_calls": 1}, "children": []}  # fmt: skip
    mid = {**leaf, "tool": "plan", "agent": {"name": "planner"}, "child_turn": "turn-2",
           "child_thread": "d-exe-1", "usage": {"model_calls": 3}, "children": [leaf]}  # fmt: skip
    refused = {**leaf, "tool": "again", "call_id": "call-2", "child_turn": None, "child_status": None,
               "status": "refused", "reason": "a cycle", "usage": {}}  # fmt: skip
    history = {
        "runs": [],
        "model_calls": [],
        "steps": [],
        "children": [mid, refused],
        "usage": {"model_calls": 5},
    }
    print_history(history)
    out = capsys.readouterr().out
    assert (
        "delegated:\n  plan call-1 -> agent planner, turn turn-2 in thread d-exe-1, completed: 3 model" in out
    )
    assert (
        "    write call-1 -> agent writer, turn turn-3 in thread d-exe-2, completed: 1 model calls\n" in out
    )
    assert "  again call-2 -> agent writer, no child, refused (a cycle)\n" in out
    assert "usage, children included: 5 model calls" in out


def test_a_delegation_record_moves_only_as_its_table_says() -> None:
    S = rules.DelegationStatus
    assert rules.OPEN_DELEGATION == {S.RUNNING, S.OVER_BUDGET}
    assert delegation_becomes(S.SETTLED).guard == "status IN ('over_budget', 'running')"
    assert delegation_becomes(S.OVER_BUDGET).guard == "status IN ('running')"
    with pytest.raises(IllegalTransitionError):
        delegation_becomes(S.RUNNING)  # nothing moves back to running
