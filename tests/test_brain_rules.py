"""The Brain's business rules, without servers: state tables, sequencing, the scripted model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from brain.models import Message, ScriptedModel, make_model
from brain.rules.sequencing import Arrival, classify, drainable, replay_from
from brain.rules.states import (
    EXECUTION_TRANSITIONS,
    ExecutionStatus,
    TurnPhase,
    TurnStatus,
    execution_transition,
    phase_transition,
    turn_transition,
)
from protocol import IllegalTransitionError, SchemaError


def test_a_finished_turn_can_never_move_again():
    for terminal in (TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.CANCELLED):
        for target in TurnStatus:
            with pytest.raises(IllegalTransitionError):
                turn_transition(terminal, target)


def test_the_agent_loop_phases_follow_their_table():
    path = [
        TurnPhase.PREPARE,
        TurnPhase.MODEL_REQUEST,
        TurnPhase.DISPATCH_TOOLS,
        TurnPhase.WAIT_TOOLS,
        TurnPhase.APPLY_RESULTS,
        TurnPhase.MODEL_REQUEST,
        TurnPhase.FINALIZE,
        TurnPhase.DONE,
    ]
    for old, new in zip(path, path[1:], strict=False):
        assert phase_transition(old, new) is new
    with pytest.raises(IllegalTransitionError, match="dispatch_tools to finalize"):
        phase_transition(TurnPhase.DISPATCH_TOOLS, TurnPhase.FINALIZE)


def test_only_reconcile_or_rerun_leaves_unknown_and_success_is_final():
    assert EXECUTION_TRANSITIONS[ExecutionStatus.UNKNOWN] == {
        ExecutionStatus.RUNNING,
        ExecutionStatus.SUCCEEDED,
        ExecutionStatus.FAILED,
    }
    with pytest.raises(IllegalTransitionError):
        execution_transition(ExecutionStatus.SUCCEEDED, ExecutionStatus.RUNNING)
    with pytest.raises(IllegalTransitionError):
        execution_transition(ExecutionStatus.INTENDED, ExecutionStatus.SUCCEEDED)


@pytest.mark.parametrize(
    ("last", "seq", "expected"),
    [
        (0, 1, Arrival.APPLY),
        (3, 4, Arrival.APPLY),
        (3, 3, Arrival.DUPLICATE),
        (3, 1, Arrival.DUPLICATE),
        (3, 5, Arrival.HOLD),
        (0, 2, Arrival.HOLD),
    ],
)
def test_events_are_applied_only_as_a_contiguous_prefix(last, seq, expected):
    assert classify(last, seq) is expected


@pytest.mark.parametrize(
    ("last", "seq", "expected"),
    [(3, 4, Arrival.LATE), (3, 9, Arrival.LATE), (3, 3, Arrival.DUPLICATE), (3, 2, Arrival.DUPLICATE)],
)
def test_a_new_event_for_an_execution_the_brain_settled_is_late_not_applied(last, seq, expected):
    # A turn that ended settled its executions; what the Hands say afterwards changes nothing
    assert classify(last, seq, settled=True) is expected


def test_held_events_drain_in_order_up_to_the_next_gap():
    assert drainable(2, [5, 3, 4, 7]) == [3, 4, 5]
    assert drainable(2, [4, 5]) == []
    assert drainable(2, [1, 2, 3, 3]) == [3]


def test_a_replay_is_asked_from_the_first_missing_seq_only_when_there_is_a_gap():
    assert replay_from(2, [4, 5]) == 3
    assert replay_from(2, [3, 5]) is None
    assert replay_from(2, []) is None


async def test_the_scripted_model_answers_from_its_script_by_position_in_the_turn():
    model = ScriptedModel(
        [
            {"tool_calls": [{"tool": "t", "args": {"n": 1}}, {"tool": "t", "args": {"n": 2}}]},
            {"tool_calls": [{"tool": "t", "args": {"n": 3}}]},
            {"content": "done:\n{results}"},
        ]
    )
    history = [Message(role="user", turn_id="T", content={"text": "go"})]
    first = await model.complete(instructions="", history=history, turn_id="T", tools=[])
    assert [c.call_id for c in first.tool_calls] == ["call-1", "call-2"]
    history += [
        Message(
            role="assistant",
            turn_id="T",
            content={"tool_calls": [c.model_dump() for c in first.tool_calls]},
        ),
        Message(role="tool", turn_id="T", content={"call_id": "call-1", "result": {"ok": 1}}),
        Message(role="tool", turn_id="T", content={"call_id": "call-2", "result": {"ok": 2}}),
    ]
    second = await model.complete(instructions="", history=history, turn_id="T", tools=[])
    assert [c.call_id for c in second.tool_calls] == ["call-3"]
    history.append(
        Message(
            role="assistant",
            turn_id="T",
            content={"tool_calls": [second.tool_calls[0].model_dump()]},
        )
    )
    final = await model.complete(instructions="", history=history, turn_id="T", tools=[])
    assert final.content == 'done:\n- call-1: {"ok": 1}\n- call-2: {"ok": 2}'


async def test_a_gated_script_entry_answers_only_once_its_file_exists(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    model = ScriptedModel([{"gate": str(gate), "content": "after the gate"}])
    history = [Message(role="user", turn_id="T", content={"text": "go"})]
    call = asyncio.create_task(model.complete(instructions="", history=history, turn_id="T", tools=[]))
    await asyncio.sleep(0.3)
    assert not call.done()
    gate.touch()
    assert (await asyncio.wait_for(call, 5)).content == "after the gate"


def test_an_unknown_model_kind_is_a_clear_error():
    with pytest.raises(SchemaError, match="unknown model kind 'gpt'"):
        make_model({"kind": "gpt"})


# ---- wake-up hints ------------------------------------------------------------------------


async def test_a_wake_hint_ends_the_claim_loops_wait_and_one_that_came_meanwhile_is_kept() -> None:
    import asyncio

    from brain.run.runs import Wakeups

    wakeups = Wakeups()
    waiting = asyncio.create_task(wakeups.wait(5.0))
    await asyncio.sleep(0)
    wakeups.hint()
    assert await asyncio.wait_for(waiting, timeout=0.2) is True
    # A hint while the loop is busy (claiming, or all its run slots taken) is kept: the next wait
    # ends at once
    wakeups.hint()
    assert await asyncio.wait_for(wakeups.wait(5.0), timeout=0.2) is True
    # and a wait cut short by something else (a run ending) takes no hint with it
    cut = asyncio.create_task(wakeups.wait(5.0))
    await asyncio.sleep(0.01)
    cut.cancel()
    await asyncio.gather(cut, return_exceptions=True)
    wakeups.hint()
    assert await asyncio.wait_for(wakeups.wait(5.0), timeout=0.2) is True
    # and a wait that no hint ends says so
    assert await wakeups.wait(0.01) is False


class _Looks:
    """The store and context a claim loop needs, counting its looks for claimable turns."""

    def __init__(self) -> None:
        self.looks = 0
        self.active: set[str] = set()
        self.store = self
        self.turns = self  # the store's turns part: where a claim looks

    async def anything_claimable(self) -> bool:
        self.looks += 1
        return False


@pytest.mark.parametrize(
    ("left", "capacity", "looks_again"),
    [
        (TurnStatus.WAITING, 4, False),  # waits for its tools: nothing new is claimable
        (TurnStatus.COMPLETED, 4, True),  # its thread is free for the next queued turn
        (TurnStatus.RUNNING, 4, True),  # handed back (controls came): a claim takes it on
        (None, 4, True),  # failed or fenced out
        (TurnStatus.WAITING, 1, True),  # the loop waited for a free slot
    ],
)
async def test_the_claim_loop_looks_again_after_a_run_only_when_that_can_find_something(
    monkeypatch: pytest.MonkeyPatch, left: TurnStatus | None, capacity: int, looks_again: bool
) -> None:
    from brain.run import runs
    from tests.test_agent_rules import _row

    go, ended = asyncio.Event(), asyncio.Event()

    async def drive(ctx: object, row: object) -> object:
        await go.wait()
        ended.set()
        return None if left is None else _row(status=left)

    async def claim_turns(ctx: object, free: int) -> object:  # a hint's claim: it takes nothing
        return type("Claim", (), {"moved": [], "settled": [], "runs": [], "more": False})()

    monkeypatch.setattr(runs, "drive", drive)
    monkeypatch.setattr(runs, "claim_turns", claim_turns)
    ctx, wakeups = _Looks(), runs.Wakeups()
    scheduler = runs.Scheduler(ctx, capacity=capacity, wakeups=wakeups, interval=60.0)  # type: ignore[arg-type]
    scheduler.adopt(_row(id="t2"))
    if capacity == 1:
        wakeups.hint()  # something to claim, and no free slot: the loop waits for one
    loop = asyncio.create_task(scheduler.run())
    try:
        for _ in range(50):
            await asyncio.sleep(0)
        before = ctx.looks
        go.set()
        await asyncio.wait_for(ended.wait(), 5)
        for _ in range(50):  # the loop's turn to look, if it will
            await asyncio.sleep(0)
        assert (ctx.looks > before) is looks_again
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


def test_a_model_call_too_fast_to_measure_reads_under_a_millisecond_never_zero() -> None:
    from brain.rules.words import latency

    assert [latency(ms) for ms in (0.0, 0.4, 1.0, 12.6, 1500.0, None)] == [
        "<1 ms",
        "<1 ms",
        "1 ms",
        "13 ms",
        "1.5 s",
        "an unrecorded time",
    ]
