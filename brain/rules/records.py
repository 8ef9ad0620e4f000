"""What the Brain store takes and gives: plain records, the same on every backend.

A driver never writes SQL: it computes a :class:`Move` (where one turn goes next and the facts of
that step) from what it knows, and hands it to the store, which commits many of them in one
transaction. Each move is guarded by the turn as the driver knew it (owner, epoch, status,
phase, revision), so a move made on a stale view is refused whole, with its journal entry and
its executions, and never half applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from brain.rules.states import TurnPhase, TurnStatus, phase_path_exists, turn_transition
from protocol import IllegalTransitionError


@dataclass(frozen=True)
class Lease:
    """Ownership of one turn by one run; every commit is checked against the epoch."""

    turn_id: str
    owner: str
    epoch: int


@dataclass(frozen=True)
class TurnRow:
    """One turn as the Brain works with it (the columns of ``turns`` it reads)."""

    id: str
    namespace: str
    session_id: str
    thread_id: str
    request_id: str
    status: TurnStatus
    phase: TurnPhase
    revision: int
    lease_owner: str | None
    lease_epoch: int
    waiting_for: str | None
    model_calls: int
    tool_step: int
    retries: int
    runs: int
    result: Any
    error: Any
    created_at: datetime
    crashes: int = 0  # Brains that died at ``crash_at`` of this turn, one after the other
    crash_at: str | None = None
    pending: int = 0  # controls received and not decided yet: applied at the next boundary
    cancel_requested: bool = False  # cancelling: it ends once its executions are settled
    model_attempt: int = 0  # attempts of its next model call that ended without a reply

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> TurnRow:
        return cls(
            id=rec["id"],
            namespace=rec["namespace"],
            session_id=rec["session_id"],
            thread_id=rec["thread_id"],
            request_id=rec["request_id"],
            status=TurnStatus(rec["status"]),
            phase=TurnPhase(rec["phase"]),
            revision=rec["revision"],
            lease_owner=rec["lease_owner"],
            lease_epoch=rec["lease_epoch"],
            waiting_for=rec["waiting_for"],
            model_calls=rec["model_calls"],
            tool_step=rec["tool_step"],
            retries=rec["retries"],
            runs=rec["runs"],
            result=rec["result"],
            error=rec["error"],
            created_at=rec["created_at"],
            crashes=rec["crashes"],
            crash_at=rec["crash_at"],
            pending=rec["pending"],
            cancel_requested=bool(rec["cancel_requested"]),
            model_attempt=rec["model_attempt"],
        )

    @property
    def lease(self) -> Lease:
        assert self.lease_owner is not None, f"turn {self.id} is not leased"
        return Lease(self.id, self.lease_owner, self.lease_epoch)


@dataclass(frozen=True)
class Intent:
    """A tool execution to commit with the move that decided it, and its packed command.

    Most are INTENDED: their command goes out once committed. A call the Brain refuses itself
    (arguments that are not JSON, or that fail the tool's schema) is FAILED from the start, with
    its ``error`` and how="rejected", and sends nothing: it goes back to the model as a failed
    tool result. A call that needs a person (an approval, or a manual tool's result) is PENDING
    until `brain respond` decides it.
    """

    execution_id: str
    tool_step: int
    call_id: str
    route: str
    tool: str
    binding_digest: str
    replay_policy: str
    request_digest: str
    command_message_id: str
    command: bytes | None
    queue: str  # where the command goes once committed
    journal_detail: bool = False  # its acceptance and start are journaled too
    status: str = "intended"
    error: dict[str, str] | None = None
    awaits: str | None = None  # PENDING: "approval" (then it is sent), "result" (a manual tool), or a
    # built-in's wait (brain.rules.waits): "clock", "signal", "approval"
    wait_key: str | None = None  # the signal a built-in wait_for_signal waits for
    wait_seconds: float | None = None  # a built-in wait: seconds from its commit until the clock answers it
    batch: Mapping[str, Any] | None = None  # a batch call's manifest, frozen with it (brain.rules.batches)

    @property
    def sends(self) -> bool:
        """Whether its command goes out once committed."""
        return self.status == "intended"

    @property
    def how(self) -> str | None:
        """What its row's ``how`` says from the start."""
        return "rejected" if self.error else (f"awaiting_{self.awaits}" if self.awaits else None)


@dataclass(frozen=True)
class Move:
    """One turn's next committed step: from the row as the driver knew it to new values.

    ``wake_in``: seconds from the commit until the turn is due again (None keeps ``wake_at``);
    ``release``: the run gives the lease up (the turn waits, ended, or retries later);
    ``facts``: the journal entry of this step (none written when empty); ``freeze``: the tool
    bindings to freeze into the turn's thread, when this move is its first prepare.
    """

    before: TurnRow
    status: TurnStatus
    phase: TurnPhase
    release: bool = False
    waiting_for: str | None = None
    model_calls: int | None = None  # None: as before
    tool_step: int | None = None
    retries: int | None = None
    model_attempt: int | None = None
    wake_in: float | None = None
    result: Any = None
    error: Any = None
    facts: tuple[dict[str, Any], ...] = ()
    intents: tuple[Intent, ...] = ()
    freeze: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # No store is ever handed a move the tables forbid (brain.rules.moves checks each step).
        if self.status != self.before.status:
            turn_transition(self.before.status, self.status)
        if not phase_path_exists(self.before.phase, self.phase):
            raise IllegalTransitionError(f"turn phase cannot move from {self.before.phase} to {self.phase}")

    @property
    def lease(self) -> Lease:
        return self.before.lease

    def value(self, name: str) -> Any:
        """The column's new value: this move's, or the row's as it was."""
        mine = getattr(self, name)
        return getattr(self.before, name) if mine is None else mine


@dataclass(frozen=True)
class Moved:
    """A move that committed: the turn as it is now, and its journal entry's seq (if any)."""

    row: TurnRow
    seq: int | None
    froze: bool = False  # it froze its thread's bindings (nobody had before it)


@dataclass(frozen=True)
class Claimed:
    """Turns one claim took (each under a new run), and whether others were claimable too."""

    rows: list[TurnRow]
    more: bool
    now: datetime | None = None  # the database's clock at the claim


@dataclass(frozen=True)
class Entry:
    """One journal entry: the facts one commit recorded about one turn (or its session)."""

    session_id: str
    seq: int
    thread_id: str | None
    turn_id: str | None
    run: int | None
    status: str | None
    phase: str | None
    facts: list[dict[str, Any]]
    created_at: datetime

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Entry:
        return cls(**{k: rec[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class TurnView:
    """A turn as it is described: its row, its journal entries in order, and its executions by
    step and call id (``brain.store.sql.VIEW_EXECUTION_COLUMNS`` of each)."""

    turn: TurnRow
    entries: list[Entry]
    executions: list[dict[str, Any]]


@dataclass
class Control:
    """A control message (a cancel, a reconcile) committed in the outbox, to publish after the
    commit."""

    queue: str
    message_id: str
    payload: bytes
    outbox_id: int | None = None


@dataclass
class Settled:
    """What failing a turn from outside its run did: the cancels its executions need."""

    turn_id: str
    controls: list[Control] = field(default_factory=list)
    created_at: datetime | None = None  # when the turn was accepted


@dataclass
class ClaimBudget:
    """How many turns an event apply may claim for its own Brain's runs (the free run slots),
    so that a turn whose tools just finished goes on there without another commit."""

    owner: str
    lease_seconds: float
    left: int

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        return True


@dataclass(frozen=True)
class Ended:
    """An execution an apply ended: its tool, how, and when its intent was committed."""

    tool: str
    status: str
    created_at: datetime


@dataclass
class Applied:
    """What one apply of several executions' events did: per range, None or the error that
    refused it (nothing of that range was written); the turns it woke; those it claimed, and per
    range the claimed turns its events completed the step of (each claimed turn once)."""

    refused: list[Exception | None]
    woken: int = 0
    claimed: list[TurnRow] = field(default_factory=list)
    claimed_by: list[list[TurnRow]] = field(default_factory=list)
    ended: dict[str, Ended] = field(default_factory=dict)  # by execution id: the tools it ended
    # Of each claimed turn: the seq and facts of the entry the apply journaled for it.
    entries: dict[str, tuple[int, list[dict[str, Any]]]] = field(default_factory=dict)
    # The executions it ended as the history reads them (``brain.rules.history.tool_message``'s keys).
    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)

    def by_range(self) -> list[tuple[Exception | None, list[TurnRow]]]:
        return list(zip(self.refused, self.claimed_by or [[] for _ in self.refused], strict=True))
