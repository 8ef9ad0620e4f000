"""The lifecycle of a sandbox binding: one enum, one transition table.

    CREATING ──► READY ──► DELETING ──► DELETED ──► CREATING (a new generation, a new identity)
       │  ▲                  ▲
       │  └── reconcile ──┐  │
       ▼                  │  │
    UNKNOWN ──────────────┴──┤ (request-deletion from any live status)
       │                     │
       └──► FAILED ──────────┘  (reconcile: nothing is there)

CREATING: the identity (and the nonce the provider's labels and the workspace marker carry) is
committed *before* the provider is asked, so a creation whose reply was lost is found again by it
and never made twice. UNKNOWN: the provider shows something under the identity that this binding
cannot vouch for (no labels, another nonce), or could not be asked within the budget; only a
``reconcile-creation`` with evidence leaves it (READY or FAILED), and it neither creates nor
rewrites anything.
"""

from __future__ import annotations

from enum import StrEnum

from protocol import IllegalTransitionError


class SandboxStatus(StrEnum):
    CREATING = "creating"
    READY = "ready"
    UNKNOWN = "unknown"
    FAILED = "failed"
    DELETING = "deleting"
    DELETED = "deleted"


S = SandboxStatus

TRANSITIONS: dict[SandboxStatus, frozenset[SandboxStatus]] = {
    S.CREATING: frozenset({S.CREATING, S.READY, S.UNKNOWN, S.DELETING}),
    S.READY: frozenset({S.READY, S.DELETING}),
    S.UNKNOWN: frozenset({S.DELETING}),
    S.FAILED: frozenset({S.DELETING}),
    S.DELETING: frozenset({S.DELETING, S.DELETED}),
    S.DELETED: frozenset({S.CREATING}),
}

# Moves only a reconcile-creation (a person with evidence) may make.
RECONCILE_TRANSITIONS: dict[SandboxStatus, frozenset[SandboxStatus]] = {
    S.UNKNOWN: frozenset({S.READY, S.FAILED}),
}

# A binding in one of these may get a new user (an execution that starts a command in it).
STARTS: frozenset[SandboxStatus] = frozenset({S.CREATING, S.READY})


def transition(
    old: SandboxStatus | str, new: SandboxStatus | str, *, reconcile: bool = False
) -> SandboxStatus:
    """``new`` if the table allows ``old -> new``; IllegalTransitionError if not."""
    old, new = SandboxStatus(old), SandboxStatus(new)
    allowed = TRANSITIONS[old] | (RECONCILE_TRANSITIONS.get(old, frozenset()) if reconcile else frozenset())
    if new not in allowed:
        if old is S.UNKNOWN and new in RECONCILE_TRANSITIONS[S.UNKNOWN]:
            raise IllegalTransitionError(
                f"a sandbox whose creation is UNKNOWN becomes {new.value.upper()} only by "
                "`hands sandbox reconcile-creation` with evidence"
            )
        raise IllegalTransitionError(f"a sandbox cannot go from {old.value.upper()} to {new.value.upper()}")
    return new
