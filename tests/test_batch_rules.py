"""The batch executor's rules, without servers: the manifest a batch call freezes, the children's
derived identities, admission (ordered, bounded parallel, all-settled, fail-fast) and the report."""

from __future__ import annotations

from typing import Any

import pytest

from brain.rules import batches
from brain.rules.batches import child_id, manifest, next_step, parent_of, report
from brain.rules.history import ThreadHistory, needed_executions
from brain.rules.records import Entry

ECHO = {
    "name": "echo", "route": "lab", "digest": "d-echo", "replay_policy": "safe",
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
                     "additionalProperties": False},
}  # fmt: skip
BINDINGS: dict[str, Any] = {"echo": ECHO, "batch": batches.BINDING}


def test_a_manifest_takes_the_defaults_and_freezes_the_child_tools_binding() -> None:
    m = manifest({"tool": "echo", "items": [{"text": "a"}, {"text": "b"}]}, BINDINGS)
    assert (m.mode, m.limit, m.on_failure, m.width) == ("parallel", 4, "all_settled", 4)
    assert m.binding == ECHO and len(m.items) == 2
    ordered = manifest({"tool": "echo", "items": [{"text": "a"}], "mode": "ordered", "limit": 9}, BINDINGS)
    assert ordered.width == 1  # ordered: one at a time, whatever the limit


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ({"tool": "nope", "items": [{}]}, "no tool named 'nope'"),
        ({"tool": "batch", "items": [{"tool": "echo", "items": []}]}, "only a Hands tool"),
        ({"tool": "echo", "items": [{"text": "a"}, {"text": 3}]}, "item 1: the arguments do not fit"),
    ],
)
def test_a_batch_the_brain_cannot_run_is_refused_saying_why(args: dict[str, Any], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        manifest(args, BINDINGS)


def test_a_tool_that_needs_an_approval_per_call_cannot_be_batched() -> None:
    with pytest.raises(ValueError, match="approval"):
        manifest({"tool": "echo", "items": [{"text": "a"}]}, BINDINGS, approvals=["echo"])


def test_a_childs_id_is_derived_from_its_batch_and_index_and_read_back() -> None:
    parent = "exe-0190a1b2c3d47e8f9a0b1c2d3e4f5a6b"
    assert child_id(parent, 7) == "exe-b7-0190a1b2c3d47e8f9a0b1c2d3e4f5a6b"
    assert parent_of(child_id(parent, 7)) == (parent, 7)
    assert child_id(parent, 7).endswith(parent.removeprefix("exe-"))  # the Hands read its age from the end
    # An ordinary execution id (its hex may start with b) is no child
    for other in (parent, "exe-b0190a1b2c3d47e8f9a0b1c2d3e4f5a6", "exe-bx-123", "exe-b1-", "exe-b1-a-b"):
        assert parent_of(other) is None, other


def test_parallel_admits_up_to_its_limit_and_refills_each_freed_slot() -> None:
    waiting = ["pending"] * 10
    assert next_step("parallel", 4, "all_settled", waiting).admit == (0, 1, 2, 3)
    running = ["running"] * 4 + ["pending"] * 6
    assert next_step("parallel", 4, "all_settled", running).admit == ()
    one_done = ["succeeded"] + ["running"] * 3 + ["pending"] * 6
    assert next_step("parallel", 4, "all_settled", one_done).admit == (4,)
    # An UNKNOWN child holds its slot until a reconcile settles it
    unknown = ["unknown"] + ["running"] * 3 + ["pending"] * 6
    assert next_step("parallel", 4, "all_settled", unknown).admit == ()


def test_ordered_admits_the_next_only_once_the_one_before_settled() -> None:
    assert next_step("ordered", 8, "all_settled", ["pending"] * 3).admit == (0,)
    assert next_step("ordered", 8, "all_settled", ["accepted", "pending", "pending"]).admit == ()
    assert next_step("ordered", 8, "all_settled", ["unknown", "pending"]).admit == ()
    assert next_step("ordered", 8, "all_settled", ["failed", "pending", "pending"]).admit == (1,)


def test_all_settled_runs_every_call_and_succeeds_whatever_each_became() -> None:
    assert next_step("parallel", 2, "all_settled", ["failed", "running", "pending"]).admit == (2,)
    done = next_step("parallel", 2, "all_settled", ["failed", "succeeded", "cancelled"])
    assert (done.admit, done.skip, done.outcome) == ((), (), "succeeded")
    assert next_step("parallel", 2, "all_settled", ["succeeded", "unknown"]).outcome is None


def test_fail_fast_admits_nothing_after_a_failure_and_fails_once_nothing_runs() -> None:
    step = next_step("parallel", 3, "fail_fast", ["failed", "running", "running", "pending", "pending"])
    assert (step.admit, step.skip, step.outcome) == ((), (3, 4), None)
    step = next_step("parallel", 3, "fail_fast", ["failed", "succeeded", "succeeded", "cancelled"])
    assert (step.admit, step.skip, step.outcome) == ((), (), "failed")
    clean = next_step("ordered", 1, "fail_fast", ["succeeded", "succeeded"])
    assert clean.outcome == "succeeded"


def test_the_report_links_each_call_to_its_execution_and_links_a_big_result_by_id() -> None:
    children = [
        {"index": 1, "id": "exe-b1-x", "call_id": "c#1", "status": "failed", "how": "ran",
         "result": None, "error": {"code": "tool_error", "message": "no"}},
        {"index": 0, "id": "exe-b0-x", "call_id": "c#0", "status": "succeeded", "how": "ran",
         "result": {"ok": 1}, "error": None},
        {"index": 2, "id": "exe-b2-x", "call_id": "c#2", "status": "succeeded", "how": "verified_by_query",
         "result": {"blob": "x" * 5000}, "error": None},
    ]  # fmt: skip
    out = report(3, "parallel", "all_settled", children)
    assert [c["execution_id"] for c in out["calls"]] == ["exe-b0-x", "exe-b1-x", "exe-b2-x"]
    assert out["calls"][0]["result"] == {"ok": 1}
    assert out["calls"][1]["error"]["message"] == "no"
    assert "result" not in out["calls"][2] and out["calls"][2]["result_bytes"] > 5000
    assert out["counts"] == {"succeeded": 2, "failed": 1}


def test_the_models_conversation_has_no_message_for_a_batchs_children() -> None:
    parent = "exe-0190a1b2c3d47e8f9a0b1c2d3e4f5a6b"
    kids = [child_id(parent, i) for i in range(2)]
    fact = {"kind": "turn.results_applied", "executions": [parent, *kids]}
    entry = Entry("s", 1, "t", "turn", None, None, None, [fact], None)  # type: ignore[arg-type]
    assert needed_executions([entry]) == [parent]
    row = {"id": parent, "call_id": "c", "tool": "batch", "status": "succeeded", "result": {}, "error": None,
           "how": "batch"}  # fmt: skip
    history = ThreadHistory()
    history.extend([entry], {parent: row, **{k: {**row, "id": k} for k in kids}}, "t")
    assert [m.content["execution_id"] for m in history.messages] == [parent]


def test_a_batchs_children_reach_ag_ui_as_custom_events_and_its_own_outcome_as_a_tool_result() -> None:
    from ag_ui.core import CustomEvent, ToolCallResultEvent

    from brain.api.agui_events import AguiEvents

    parent = "exe-0190a1b2c3d47e8f9a0b1c2d3e4f5a6b"
    kid = child_id(parent, 0)
    said = [
        {"kind": "execution.succeeded", "execution_id": kid, "call_id": "call-1#0", "tool": "echo"},
        {"kind": "execution.succeeded", "execution_id": parent, "call_id": "call-1", "tool": "batch"},
    ]
    entry = {"turn_id": "turn-1", "session_id": "s", "thread_id": "t", "seq": 3, "facts": said}
    out = AguiEvents().entry(entry, {kid: {"result": {"n": 0}}, parent: {"result": {"calls": []}}})
    assert isinstance(out[0], CustomEvent) and out[0].name == "tendon.execution.succeeded"
    assert isinstance(out[1], ToolCallResultEvent) and out[1].tool_call_id == "call-1"


def test_a_watcher_reads_a_batchs_progress_in_words() -> None:
    from brain.rules import facts
    from brain.rules.words import said

    counts = {"done": 3, "failed": 1, "in_flight": 2, "waiting": 4}
    line = said(facts.batch_progress("exe-x", "call-1", counts, admitted=["exe-b4-x"], skipped=0))
    assert line == "batch call-1: 1 call(s) started (3 done, 1 failed, 2 running, 4 waiting)"
    ended = said(facts.batch_progress("exe-x", "call-1", counts, skipped=4, ended="failed"))
    assert "4 call(s) will not run, it failed" in ended
    accepted = said(
        facts.batch_accepted(
            "exe-x",
            "call-1",
            {"tool": "echo", "mode": "ordered", "limit": 4, "on_failure": "fail_fast", "size": 9},
        )
    )
    assert accepted == "batch call-1 accepted: 9 calls of echo, ordered (at most 1 at once), fail_fast"


def test_a_watcher_counts_only_the_models_calls_among_the_results_that_went_to_it() -> None:
    from brain.rules import facts
    from brain.rules.words import said

    parent = "exe-0190a1b2c3d47e8f9a0b1c2d3e4f5a6b"
    applied = facts.results_applied([parent, *(child_id(parent, i) for i in range(3))])
    assert said(applied) == "the results of 1 tool call(s) went to the model"
