"""What a control does to a turn in a given state, as a pure rule (:func:`decide`); the verbs that
record and carry it out are ``brain.verbs.controls``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from brain.rules.states import TERMINAL_TURN, TurnStatus


class Kind(StrEnum):
    STEER = "steer"
    INJECT = "inject"
    WITHDRAW = "withdraw"
    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"


class Outcome(StrEnum):
    APPLY = "applied"  # done in the control's own commit
    DEFER = "received"  # done at the turn's next boundary (or once its executions are settled)
    REJECT = "rejected"


INPUTS = (Kind.STEER, Kind.INJECT)


@dataclass(frozen=True)
class TurnView:
    """What :func:`decide` needs to know of a turn."""

    status: TurnStatus
    leased: bool  # a run holds it right now (mid-phase)
    revision: int
    # Executions a Hands worker accepted that are not settled yet (UNKNOWN ones are): a cancel
    # waits for those; one that no worker accepted is settled with the cancel.
    accepted_executions: int
    cancelling: bool
    pause_pending: bool  # a pause was received and waits for the turn's boundary


def decide(kind: Kind, turn: TurnView, body: Mapping[str, Any]) -> tuple[Outcome, str | None]:
    """What a control does to a turn in this state: applied now, deferred to the boundary, or
    rejected (with the reason)."""
    if turn.status in TERMINAL_TURN:
        return Outcome.REJECT, f"the turn is {turn.status} already"
    if turn.cancelling:
        if kind is Kind.CANCEL:
            return Outcome.DEFER, None  # decided with the cancel under way
        return Outcome.REJECT, "the turn is being cancelled"
    if kind in INPUTS:
        return Outcome.DEFER, None
    if kind is Kind.PAUSE:
        if turn.status is TurnStatus.PAUSED:
            return Outcome.APPLY, "it was paused already"
        return (Outcome.DEFER, None) if turn.leased else (Outcome.APPLY, None)
    if kind is Kind.RESUME:
        if turn.status is TurnStatus.PAUSED:
            seen = body.get("revision")
            if seen != turn.revision:
                return Outcome.REJECT, (
                    f"the turn is at revision {turn.revision}, not {seen}: look at it again, then resume"
                )
            return Outcome.APPLY, None
        if turn.pause_pending:
            return Outcome.APPLY, "the pause not applied yet is withdrawn"
        return Outcome.REJECT, "the turn is not paused"
    if kind is Kind.CANCEL:
        if at_boundary(kind, turn, body):
            return Outcome.DEFER, None
        if turn.status is TurnStatus.QUEUED or turn.accepted_executions == 0:
            return Outcome.APPLY, None
        return Outcome.DEFER, None
    raise AssertionError(kind)  # withdraw is decided by its target, in ``_withdraw``


def at_boundary(kind: Kind, turn: TurnView, body: Mapping[str, Any]) -> bool:
    """Whether a cancel waits for the run that holds the turn to reach its next commit: a new
    message's interrupt (``brain.rules.doubletext``) keeps the work so far, so the model call in
    flight is let finish and its reply committed; the calls it asks for are then closed as
    cancelled before any is sent (``brain.run.interrupts``). Any other cancel ends the turn now."""
    return (
        kind is Kind.CANCEL and body.get("strategy") == "interrupt" and turn.leased
        and turn.status is TurnStatus.RUNNING and not turn.cancelling
    )  # fmt: skip
