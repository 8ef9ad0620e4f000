"""The pure rules of Hands: the ledger state machine, the replay decision (invariant 6), and a
batch's slots when it is cancelled (no servers)."""

from __future__ import annotations

import itertools

import pytest

import hands
from hands.rules.replay import Recovery, decide
from hands.rules.states import (
    OPEN_STATUSES,
    TERMINAL_STATUSES,
    TRANSITIONS,
    LedgerStatus,
    transition,
)
from protocol import IllegalTransitionError, ReplayPolicy

S = LedgerStatus
SAFE, UNSAFE = ReplayPolicy.SAFE, ReplayPolicy.UNSAFE

ALLOWED = {
    (S.ACCEPTED, S.RUNNING),
    (S.ACCEPTED, S.FAILED),
    (S.ACCEPTED, S.CANCELLED),
    (S.RUNNING, S.RUNNING),
    (S.RUNNING, S.QUERYING),
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.CANCELLED),
    (S.RUNNING, S.UNKNOWN),
    (S.QUERYING, S.QUERYING),
    (S.QUERYING, S.RUNNING),
    (S.QUERYING, S.SUCCEEDED),
    (S.QUERYING, S.CANCELLED),  # the query found nothing, and a cancel was asked meanwhile
    (S.QUERYING, S.UNKNOWN),
}


# ---- states -----------------------------------------------------------------------------


@pytest.mark.parametrize("old,new", list(itertools.product(S, S)))
def test_every_status_pair_is_allowed_exactly_when_the_table_lists_it(old: S, new: S) -> None:
    # Given any pair of statuses / When the move is asked for / Then the table decides
    if (old, new) in ALLOWED:
        assert transition(old, new) is new
    else:
        with pytest.raises(IllegalTransitionError):
            transition(old, new)


def test_the_transition_table_is_the_one_this_test_spells_out() -> None:
    assert {(o, n) for o, targets in TRANSITIONS.items() for n in targets} == ALLOWED


@pytest.mark.parametrize("final", [S.SUCCEEDED, S.FAILED])
def test_unknown_resolves_only_by_an_explicit_reconcile(final: S) -> None:
    # Given an UNKNOWN execution
    # When anything automatic tries to resolve it, Then it is refused and says why
    with pytest.raises(IllegalTransitionError, match="only by an explicit reconcile"):
        transition(S.UNKNOWN, final)
    # And a reconcile may
    assert transition(S.UNKNOWN, final, reconcile=True) is final


@pytest.mark.parametrize("old", sorted(TERMINAL_STATUSES))
def test_terminal_statuses_cannot_be_left_even_by_reconcile(old: S) -> None:
    for new in S:
        with pytest.raises(IllegalTransitionError):
            transition(old, new, reconcile=True)


def test_reconcile_cannot_skip_the_replay_rule_for_open_executions() -> None:
    with pytest.raises(IllegalTransitionError, match="from ACCEPTED to SUCCEEDED"):
        transition(S.ACCEPTED, S.SUCCEEDED, reconcile=True)


def test_statuses_are_stored_as_lowercase_strings() -> None:
    assert [s.value for s in S] == [
        "accepted",
        "running",
        "querying",
        "succeeded",
        "failed",
        "cancelled",
        "unknown",
    ]
    assert transition("running", "succeeded") is S.SUCCEEDED


# ---- replay decision --------------------------------------------------------------------

# (status, policy at intent, policy now, has query) -> decision; every row of the rule.
RULE = [
    # The body never started: run it whatever the policy and whether or not still served.
    *[
        ((S.ACCEPTED, intent, now, q), Recovery.START)
        for intent in (SAFE, UNSAFE)
        for now in (SAFE, UNSAFE, None)
        for q in (True, False)
    ],
    # A crash inside the body (or inside the query that followed one):
    *[((status, SAFE, SAFE, q), Recovery.RERUN) for status in (S.RUNNING, S.QUERYING) for q in (True, False)],
    *[
        ((status, intent, now, True), Recovery.QUERY)
        for status in (S.RUNNING, S.QUERYING)
        for intent, now in ((SAFE, UNSAFE), (UNSAFE, SAFE), (UNSAFE, UNSAFE))
    ],
    *[
        ((status, intent, now, False), Recovery.UNKNOWN)
        for status in (S.RUNNING, S.QUERYING)
        for intent, now in ((SAFE, UNSAFE), (UNSAFE, SAFE), (UNSAFE, UNSAFE))
    ],
    # No longer served: neither re-run nor query, even if it was safe.
    *[
        ((status, intent, None, q), Recovery.UNKNOWN)
        for status in (S.RUNNING, S.QUERYING)
        for intent in (SAFE, UNSAFE)
        for q in (True, False)
    ],
]


@pytest.mark.parametrize("case,expected", RULE)
def test_the_replay_rule_decides_every_row_of_its_table(
    case: tuple[S, ReplayPolicy, ReplayPolicy | None, bool], expected: Recovery
) -> None:
    # Given an open execution whose owner died / When recovery asks / Then the rule answers
    assert decide(*case, tool="t").action is expected


def test_an_unsafe_tool_is_never_rerun_whatever_else_holds() -> None:
    cases = itertools.product((S.RUNNING, S.QUERYING), (SAFE, UNSAFE, None), (True, False))
    for status, now, q in cases:
        assert decide(status, UNSAFE, now, q).action is not Recovery.RERUN


def test_the_unknown_reason_says_which_tool_and_why() -> None:
    decision = decide(S.RUNNING, UNSAFE, UNSAFE, False, tool="send_email")
    assert decision.reason == ("worker died inside the body of unsafe tool send_email, which has no query")
    changed = decide(S.RUNNING, SAFE, UNSAFE, False, tool="sync").reason
    assert "declared safe at intent but unsafe now" in changed
    gone = decide(S.RUNNING, SAFE, None, True, tool="sync").reason
    assert "no longer served" in gone


def test_a_kept_handle_means_reattach_whatever_the_policy_but_not_before_the_body() -> None:
    for status, intent, q in itertools.product((S.RUNNING, S.QUERYING), (SAFE, UNSAFE), (True, False)):
        assert decide(status, intent, intent, q, has_handle=True).action is Recovery.REATTACH
    assert decide(S.ACCEPTED, UNSAFE, UNSAFE, False, has_handle=True).action is Recovery.START
    # Following never calls the tool: a newer version of it served follows it (the caller says so)
    assert decide(S.RUNNING, UNSAFE, None, False, has_handle=True).action is Recovery.REATTACH
    assert decide(S.RUNNING, UNSAFE, None, False, has_handle=False).action is Recovery.UNKNOWN


@pytest.mark.parametrize("status", [S.SUCCEEDED, S.FAILED, S.CANCELLED, S.UNKNOWN])
def test_statuses_that_need_no_recovery_are_refused(status: S) -> None:
    with pytest.raises(IllegalTransitionError, match="needs no recovery"):
        decide(status, SAFE, SAFE, True)


def test_open_statuses_are_exactly_those_recovery_handles() -> None:
    for status in OPEN_STATUSES:
        decide(status, SAFE, SAFE, False)


# ---- public surface ---------------------------------------------------------------------


def test_the_hands_package_exports_exactly_its_public_names() -> None:
    assert sorted(hands.__all__) == hands.__all__
    for name in hands.__all__:
        assert getattr(hands, name) is not None
    public = {n for n in vars(hands) if not n.startswith("_")}
    modules = {n for n in public if type(getattr(hands, n)).__name__ == "module"}
    assert public - modules == set(hands.__all__)


async def test_a_batch_cancelled_before_its_commands_began_gives_their_slots_back() -> None:
    """A worker's consumer task can be cancelled (its channel closed) just after a batch took
    slots for its commands and before their handling began: the slots come back, or the worker
    would run fewer executions at once for good."""
    import asyncio
    from types import SimpleNamespace

    from hands.run.parts import Batches
    from infra.process.killpoints import KillPoints
    from tests.test_envelopes import make

    slots = asyncio.Semaphore(3)
    began: list[str] = []

    async def handle_one(part: object, command: object) -> None:
        began.append("began")
        await asyncio.Event().wait()

    async def never(_: object) -> None:
        raise AssertionError("a cancelled batch is not acked")

    batches = Batches(
        queue="q",
        broker=None,
        slots=slots,
        handle_one=handle_one,
        kill=KillPoints(),
        ack=never,  # type: ignore[arg-type]
    )
    commands = [make("execute").model_copy(update={"execution_id": f"e{i}"}) for i in range(3)]
    task = asyncio.create_task(batches.handle(SimpleNamespace(headers={}), commands))  # type: ignore[arg-type]
    await asyncio.sleep(0)  # it took the three slots and made the tasks, which have not run yet
    assert slots.locked()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert began == [] and not slots.locked()
    for _ in range(3):
        await asyncio.wait_for(slots.acquire(), 0.1)  # all three are free again
