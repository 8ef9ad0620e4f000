"""A tool's output as journal facts: the pages of one apply and one attempt in one
``execution.output`` fact (text bounded, the rest read by offset), a re-run's output apart from the
first attempt's, a range that never came said as ``execution.output_gap``; the rule without servers,
then on both stores: the facts reach the session's events (what the stream sends) and the
snapshot says how much output each execution has."""

from __future__ import annotations

from typing import Any

from brain.rules.applying import OUTPUT_FACT_CHARS, Execution, effect
from brain.rules.states import ExecutionStatus
from brain.store import BrainStore
from brain.verbs import observe
from protocol import (
    AcceptedBody,
    AcceptedEvent,
    OutputPageBody,
    OutputPageEvent,
    StartedBody,
    StartedEvent,
    SucceededBody,
    SucceededEvent,
)
from tests.test_brain_store import _apply, _header, _submit, _waiting_on, store

__all__ = ["store"]  # the fixture, used by name

X = Execution("e1", "call_1", "count", attempt=1, output_bytes=0)


def _page(seq: int, offset: int, data: str) -> OutputPageEvent:
    return OutputPageEvent(seq=seq, body=OutputPageBody(offset=offset, data=data), **_header("e1"))


def _said(facts: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (
            f["kind"],
            f.get("attempt"),
            f.get("offset", f.get("start")),
            f.get("size", f.get("end")),
            f.get("text"),
        )
        for f in facts
        if f["kind"].startswith("execution.output")
    ]


def test_the_pages_of_one_apply_are_one_fact_and_its_outcome_comes_after_them() -> None:
    done = SucceededEvent(seq=4, body=SucceededBody(result=1, output_bytes=7), **_header("e1"))
    out = effect(ExecutionStatus.RUNNING, [_page(2, 0, "héllo\n"), _page(3, 7, ""), done], X)
    assert _said(out.facts) == [("execution.output", 1, 0, 7, "héllo\n")]
    assert [f["kind"] for f in out.facts] == ["execution.output", "execution.succeeded"]
    assert out.output_end == 7


def test_a_rerun_says_its_output_apart_from_the_first_attempts() -> None:
    rerun = StartedEvent(
        seq=3, body=StartedBody(attempt=2, worker="w2", reason="rerun_after_crash"), **_header("e1")
    )
    out = effect(ExecutionStatus.RUNNING, [_page(2, 0, "one\n"), rerun, _page(4, 4, "two\n")], X)
    assert _said(out.facts) == [
        ("execution.output", 1, 0, 4, "one\n"),
        ("execution.output", 2, 4, 4, "two\n"),
    ]


def test_a_range_that_never_came_is_an_explicit_gap_and_a_page_applied_before_is_not_said_again() -> None:
    after = Execution("e1", "call_1", "count", attempt=1, output_bytes=4)
    out = effect(ExecutionStatus.RUNNING, [_page(5, 0, "old\n"), _page(6, 4, "a"), _page(7, 9, "b")], after)
    assert _said(out.facts) == [
        ("execution.output", 1, 4, 1, "a"),
        ("execution.output_gap", None, 5, 9, None),
        ("execution.output", 1, 9, 1, "b"),
    ]
    assert out.output_end == 10


def test_a_big_apply_carries_a_bounded_text_and_says_it_was_cut() -> None:
    data = "x" * (OUTPUT_FACT_CHARS + 10)
    (fact,) = effect(ExecutionStatus.RUNNING, [_page(2, 0, data)], X).facts
    assert (len(fact["text"]), fact["size"], fact["cut"]) == (OUTPUT_FACT_CHARS, len(data), True)


async def test_output_reaches_the_sessions_events_and_the_snapshot_says_how_much(store: BrainStore) -> None:
    # Given a turn waiting on a running call
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "e1")
    cursor = (await observe.snapshot(store, namespace="ns", session_id="s1"))["cursor"]
    h = _header("e1")
    await _apply(store, [AcceptedEvent(seq=1, body=AcceptedBody(worker="w1"), **h)])
    await _apply(store, [StartedEvent(seq=2, body=StartedBody(attempt=1, worker="w1"), **h)])

    # When its Hands send two pages, in two applies
    await _apply(store, [_page(3, 0, "line 1\n")])
    await _apply(store, [_page(4, 7, "line 2\n")])

    # Then a reader of the session's events (what the stream sends) sees the output as it came
    page = await observe.list_events(store, namespace="ns", session_id="s1", cursor=cursor, limit=50)
    facts = [f for e in page.events for f in e["facts"]]
    assert _said(facts) == [
        ("execution.output", 1, 0, 7, "line 1\n"),
        ("execution.output", 1, 7, 7, "line 2\n"),
    ]
    # And the snapshot says how much output the execution has, to read on from the output route
    snap = await observe.snapshot(store, namespace="ns", session_id="s1")
    (turn,) = [t for t in snap["turns"] if t["id"] == turn_id]
    assert [(x["id"], x["output_bytes"]) for x in turn["executions"]] == [("e1", 14)]
