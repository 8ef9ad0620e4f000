"""The Brain's state machines as enums plus transition tables; illegal moves raise.

These are plain data and functions so that tests can check every rule without servers.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from protocol import IllegalTransitionError

E = TypeVar("E", bound=StrEnum)


class TurnStatus(StrEnum):
    """What a user sees of a turn."""

    QUEUED = "queued"  # accepted, no Brain has started it yet
    RUNNING = "running"  # claimable or owned by a Brain run
    WAITING = "waiting"  # parked until its tool executions answer; nothing in memory
    PAUSED = "paused"  # held at a safe boundary by a pause control, until a resume
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class TurnPhase(StrEnum):
    """Where the agent loop of a turn stands; each phase commits before the next begins."""

    PREPARE = "prepare"
    MODEL_REQUEST = "model_request"
    DISPATCH_TOOLS = "dispatch_tools"
    WAIT_TOOLS = "wait_tools"
    APPLY_RESULTS = "apply_results"
    FINALIZE = "finalize"
    DONE = "done"


class ExecutionStatus(StrEnum):
    """A tool execution as the Brain knows it from the sequenced events it applied."""

    PENDING = "pending"  # waits for a person's answer (an approval, or a manual tool's result)
    INTENDED = "intended"  # committed with its outbox command; maybe not yet published
    ACCEPTED = "accepted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"  # effect cannot be confirmed; only a reconcile resolves it


TURN_TRANSITIONS: dict[TurnStatus, frozenset[TurnStatus]] = {
    TurnStatus.QUEUED: frozenset(
        {TurnStatus.RUNNING, TurnStatus.PAUSED, TurnStatus.FAILED, TurnStatus.CANCELLED}
    ),
    TurnStatus.RUNNING: frozenset(
        {
            TurnStatus.RUNNING,
            TurnStatus.WAITING,
            TurnStatus.PAUSED,
            TurnStatus.COMPLETED,
            TurnStatus.FAILED,
            TurnStatus.CANCELLED,
        }
    ),
    # WAITING again: a waiting turn that begins a cancel waits on, for its executions to settle.
    TurnStatus.WAITING: frozenset(
        {TurnStatus.RUNNING, TurnStatus.WAITING, TurnStatus.PAUSED, TurnStatus.FAILED, TurnStatus.CANCELLED}
    ),
    # Resumed (or cancelled); a paused turn's tool results are still applied, it just does not go on.
    TurnStatus.PAUSED: frozenset(
        {TurnStatus.RUNNING, TurnStatus.WAITING, TurnStatus.FAILED, TurnStatus.CANCELLED}
    ),
    TurnStatus.COMPLETED: frozenset(),
    TurnStatus.FAILED: frozenset(),
    TurnStatus.CANCELLED: frozenset(),
}

PHASE_TRANSITIONS: dict[TurnPhase, frozenset[TurnPhase]] = {
    TurnPhase.PREPARE: frozenset({TurnPhase.PREPARE, TurnPhase.MODEL_REQUEST}),
    TurnPhase.MODEL_REQUEST: frozenset({TurnPhase.DISPATCH_TOOLS, TurnPhase.FINALIZE}),
    TurnPhase.DISPATCH_TOOLS: frozenset({TurnPhase.WAIT_TOOLS}),
    TurnPhase.WAIT_TOOLS: frozenset({TurnPhase.WAIT_TOOLS, TurnPhase.APPLY_RESULTS}),
    TurnPhase.APPLY_RESULTS: frozenset({TurnPhase.MODEL_REQUEST}),
    TurnPhase.FINALIZE: frozenset({TurnPhase.DONE}),
    TurnPhase.DONE: frozenset(),
}


class ControlStatus(StrEnum):
    """Where a control stands: its receipt's status."""

    RECEIVED = "received"  # recorded; decided at the turn's next boundary
    APPLIED = "applied"
    REJECTED = "rejected"
    WITHDRAWN = "withdrawn"  # taken back by a withdraw before it was applied


CONTROL_TRANSITIONS: dict[ControlStatus, frozenset[ControlStatus]] = {
    ControlStatus.RECEIVED: frozenset(
        {ControlStatus.APPLIED, ControlStatus.REJECTED, ControlStatus.WITHDRAWN}
    ),
    ControlStatus.APPLIED: frozenset(),
    ControlStatus.REJECTED: frozenset(),
    ControlStatus.WITHDRAWN: frozenset(),
}

_P, _I, _A, _R = (
    ExecutionStatus.PENDING,
    ExecutionStatus.INTENDED,
    ExecutionStatus.ACCEPTED,
    ExecutionStatus.RUNNING,
)
_S, _F, _C, _U = (
    ExecutionStatus.SUCCEEDED,
    ExecutionStatus.FAILED,
    ExecutionStatus.CANCELLED,
    ExecutionStatus.UNKNOWN,
)
EXECUTION_TRANSITIONS: dict[ExecutionStatus, frozenset[ExecutionStatus]] = {
    _P: frozenset({_I, _S, _F, _C}),  # approved (then sent), answered by hand, denied, or its turn ended
    _I: frozenset({_A, _F, _C}),  # FAILED: Hands rejected the command
    _A: frozenset({_R, _F, _C, _U}),
    _R: frozenset({_R, _S, _F, _C, _U}),  # RUNNING again: a safe re-run after a crash
    _U: frozenset({_R, _S, _F}),  # reconcile, or a query that later found nothing and re-ran
    _S: frozenset(),
    _F: frozenset(),
    _C: frozenset(),
}

# The status sets the rules and the store's statements speak of, derived from the tables.
TERMINAL_TURN = frozenset(s for s, targets in TURN_TRANSITIONS.items() if not targets)
TERMINAL_EXECUTION = frozenset(s for s, targets in EXECUTION_TRANSITIONS.items() if not targets)
# What waits for a person: PENDING. What the Hands may still be working on: the rest of the
# statuses that are neither final nor UNKNOWN (UNKNOWN waits for a reconcile, not for the Hands).
WAITING_FOR_A_PERSON = frozenset({ExecutionStatus.PENDING})
OPEN_EXECUTION = (
    frozenset(ExecutionStatus) - TERMINAL_EXECUTION - WAITING_FOR_A_PERSON - {ExecutionStatus.UNKNOWN}
)
# What a Hands worker accepted, as far as the Brain heard, and may still be working on: a cancel of
# the turn waits for these; what is open and not among them (INTENDED) the cancel settles itself.
ACCEPTED_EXECUTION = frozenset({ExecutionStatus.ACCEPTED, ExecutionStatus.RUNNING})
# Not settled: open, or waiting for a person (UNKNOWN is settled until a reconcile moves it).
UNSETTLED_EXECUTION = OPEN_EXECUTION | WAITING_FOR_A_PERSON
# Whose events the Brain still applies in order (and so may hold behind a gap).
SEQUENCED_EXECUTION = OPEN_EXECUTION | {ExecutionStatus.UNKNOWN}


# Which execution status each sequenced event kind moves to (output pages change none).
EVENT_STATUS: dict[str, ExecutionStatus | None] = {
    "accepted": _A,
    "started": _R,
    "output_page": None,
    "input_required": None,  # it runs on, waiting for a person's input (brain respond)
    "succeeded": _S,
    "failed": _F,
    "cancelled": _C,
    "unknown": _U,
}


def phase_path_exists(old: TurnPhase, new: TurnPhase) -> bool:
    """Whether ``new`` is ``old`` or can be reached from it by the table (a move may pass through
    phases that have nothing to write of their own)."""
    seen, frontier = {old}, [old]
    while frontier:
        frontier = [n for p in frontier for n in PHASE_TRANSITIONS[p] if n not in seen]
        seen.update(frontier)
    return new in seen


def _check(table: dict, old: StrEnum, new: StrEnum, what: str) -> None:  # type: ignore[type-arg]
    if new not in table[old]:
        raise IllegalTransitionError(f"{what} cannot move from {old} to {new}")


def sources(table: dict[E, frozenset[E]], new: E) -> list[str]:
    """The states that may move to ``new`` by ``table`` (for a guarded UPDATE's WHERE)."""
    return sorted(str(old) for old, targets in table.items() if new in targets)


def turn_transition(old: TurnStatus, new: TurnStatus) -> TurnStatus:
    _check(TURN_TRANSITIONS, old, new, "turn")
    return new


def phase_transition(old: TurnPhase, new: TurnPhase) -> TurnPhase:
    _check(PHASE_TRANSITIONS, old, new, "turn phase")
    return new


def execution_transition(old: ExecutionStatus, new: ExecutionStatus) -> ExecutionStatus:
    _check(EXECUTION_TRANSITIONS, old, new, "execution")
    return new
