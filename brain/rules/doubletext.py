"""Double texting: what a submit does when its thread has an unfinished turn (the submit's
``strategy``, ``multitask_strategy`` on the HTTP API, ``brain submit --if-busy``).

=========  =====================================================================================
strategy   what a submit to a busy thread does
=========  =====================================================================================
reject     refused (a CONFLICT naming the busy thread); nothing is written
enqueue    the new turn waits behind the unfinished ones (the default)
interrupt  the unfinished turns ahead stop at their next boundary: one waiting (for its tools)
           is cancelled in the submit's own commit, its running tools told to stop; one whose
           model call is in flight lets it finish, commits its reply and ends before sending the
           calls it asks for (``brain.rules.controls.at_boundary``). The work they committed
           stays in the thread's history, their calls closed with their executions' outcomes
           (cancelled, with why), so that no model sees a dangling call; then the new input
           runs after it
rollback   the same cancel, and the cancelled turns' messages leave the thread's history (their
           journal entries stay, for audit, marked by a ``turn.rolled_back`` fact)
=========  =====================================================================================

A submit whose request id made a turn already answers that turn, whatever its strategy (and does
nothing else): a repeated interrupt interrupts nothing more.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from protocol import ConflictError, SchemaError


class Strategy(StrEnum):
    REJECT = "reject"
    ENQUEUE = "enqueue"
    INTERRUPT = "interrupt"
    ROLLBACK = "rollback"


# The strategies that end the thread's unfinished turns in the submit's commit.
SUPERSEDING = frozenset({Strategy.INTERRUPT, Strategy.ROLLBACK})

INTERRUPTED = "interrupted by a new message"


def strategy_of(value: str | Strategy) -> Strategy:
    """The strategy a caller named; a SchemaError names the choices."""
    try:
        return Strategy(value)
    except ValueError:
        raise SchemaError(
            f"a submit's strategy for a busy thread is one of {', '.join(Strategy)}, not {value!r}"
        ) from None


def check_busy(known: Mapping[str, Any], strategy: Strategy, where: str) -> None:
    """Refuse a new turn that ``reject`` sends to a thread with unfinished turns (``known``: what a
    submit read, with ``thread_open``, their count)."""
    if strategy is Strategy.REJECT and known["thread_open"]:
        raise ConflictError(
            f"{where} is busy ({known['thread_open']} unfinished turn(s)) and the submit's strategy is "
            "reject: submit again once it is idle, or with enqueue, interrupt or rollback"
        )


def superseded_reason(strategy: Strategy, by_turn: str) -> str:
    """Why a turn ahead of a new one was cancelled by it (its control's and its calls' reason)."""
    how = INTERRUPTED if strategy is Strategy.INTERRUPT else "rolled back for a new message"
    return f"{how} (turn {by_turn})"
