"""The execution state machine of the Hands ledger: one enum, one transition table.

    ACCEPTED ──► RUNNING ──► SUCCEEDED | FAILED | CANCELLED
       │           │ ▲
       │           ▼ │ (query said NotFound: run it now)
       │        QUERYING ──► SUCCEEDED (verified by query) | CANCELLED (not found, cancel asked)
       │           │
       │           ▼
       │        UNKNOWN ──► SUCCEEDED | FAILED   (only by an explicit, audited reconcile)
       └──► FAILED | CANCELLED (never started)

RUNNING ─► RUNNING is a re-run after a crash (a new attempt of a safe tool); RUNNING ─►
UNKNOWN and QUERYING ─► UNKNOWN are the "nothing is guessed" exits of the replay rule.
A rejected command is *inserted* as FAILED, and a command older than the ledger keeps rows
(``infra.db.retention.may_have_been_pruned``) as UNKNOWN; inserting is not a transition.
"""

from __future__ import annotations

from enum import StrEnum

from protocol import IllegalTransitionError


class LedgerStatus(StrEnum):
    """Where one execution stands in this pool's ledger (stored as the lowercase value)."""

    ACCEPTED = "accepted"
    RUNNING = "running"
    QUERYING = "querying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


S = LedgerStatus

# Moves any component may make. Terminal statuses have no way out.
TRANSITIONS: dict[LedgerStatus, frozenset[LedgerStatus]] = {
    S.ACCEPTED: frozenset({S.RUNNING, S.FAILED, S.CANCELLED}),
    S.RUNNING: frozenset({S.RUNNING, S.QUERYING, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.UNKNOWN}),
    # CANCELLED: the query found no trace of the operation, and a cancel was asked meanwhile.
    S.QUERYING: frozenset({S.QUERYING, S.RUNNING, S.SUCCEEDED, S.CANCELLED, S.UNKNOWN}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.UNKNOWN: frozenset(),
}

# Moves only a reconcile (a person with evidence) may make.
RECONCILE_TRANSITIONS: dict[LedgerStatus, frozenset[LedgerStatus]] = {
    S.UNKNOWN: frozenset({S.SUCCEEDED, S.FAILED}),
}

# Statuses whose owner is working on it; a dead owner here means recovery must decide.
OPEN_STATUSES: frozenset[LedgerStatus] = frozenset({S.ACCEPTED, S.RUNNING, S.QUERYING})
TERMINAL_STATUSES: frozenset[LedgerStatus] = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})


def transition(old: LedgerStatus | str, new: LedgerStatus | str, *, reconcile: bool = False) -> LedgerStatus:
    """Return ``new`` if the table allows ``old -> new``; raise IllegalTransitionError if not.

    ``reconcile=True`` additionally allows the UNKNOWN exits, which nothing automatic may take.
    """
    old, new = LedgerStatus(old), LedgerStatus(new)
    allowed = TRANSITIONS[old]
    if reconcile:
        allowed = allowed | RECONCILE_TRANSITIONS.get(old, frozenset())
    if new not in allowed:
        if old is S.UNKNOWN and new in RECONCILE_TRANSITIONS[S.UNKNOWN]:
            raise IllegalTransitionError(
                f"an UNKNOWN execution becomes {new.value.upper()} only by an explicit "
                "reconcile with evidence"
            )
        raise IllegalTransitionError(
            f"execution status cannot go from {old.value.upper()} to {new.value.upper()}"
        )
    return new
