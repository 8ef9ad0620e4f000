"""Every status the Brain's store writes goes through the state tables: a write's guard is made
from the states the table lets move to the new one, and status sets are derived from the enums."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from brain.rules.states import (
    EXECUTION_TRANSITIONS,
    OPEN_EXECUTION,
    TERMINAL_EXECUTION,
    TERMINAL_TURN,
    TURN_TRANSITIONS,
    UNSETTLED_EXECUTION,
    ExecutionStatus,
    TurnStatus,
)
from brain.store import sql
from brain.store.sql import execution_becomes, turn_becomes
from protocol import IllegalTransitionError

STORE = Path(__file__).resolve().parent.parent / "brain" / "store"
# A status set by a literal in an UPDATE's SET (``SET status = 'x'`` or ``..., status = 'x'``).
LITERAL_WRITE = re.compile(r"\b(SET|,)\s*status\s*=\s*'", re.IGNORECASE)


def test_no_statement_of_the_store_writes_a_status_by_literal() -> None:
    found = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted(STORE.glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if LITERAL_WRITE.search(line)
    ]
    assert not found, "write these through turn_becomes / execution_becomes:\n" + "\n".join(found)


def test_the_literal_check_sees_a_literal_write() -> None:
    assert LITERAL_WRITE.search("UPDATE turns SET status = 'failed', error = $2")
    assert LITERAL_WRITE.search("SET waiting_for = NULL, status = 'running'")
    assert not LITERAL_WRITE.search("WHERE status = 'waiting'")


@pytest.mark.parametrize("new", list(TurnStatus))
def test_a_turn_write_is_guarded_by_every_state_the_table_lets_move_to_it(new: TurnStatus) -> None:
    sources = sorted(str(old) for old, targets in TURN_TRANSITIONS.items() if new in targets)
    if not sources:  # queued: only a submit's insert makes it
        with pytest.raises(IllegalTransitionError):
            turn_becomes(new)
        return
    write = turn_becomes(new, alias="t")
    assert write.set == f"status = '{new}'"
    assert write.guard == "t.status IN (" + ", ".join(f"'{s}'" for s in sources) + ")"


def test_a_write_from_a_state_the_table_forbids_is_refused_when_it_is_made() -> None:
    with pytest.raises(IllegalTransitionError, match="completed"):
        turn_becomes(TurnStatus.RUNNING, from_={TurnStatus.COMPLETED})
    with pytest.raises(IllegalTransitionError):
        execution_becomes(ExecutionStatus.INTENDED, from_={ExecutionStatus.SUCCEEDED})
    # and an allowed narrower guard keeps only what it names
    assert turn_becomes(TurnStatus.RUNNING, from_={TurnStatus.WAITING}).guard == "status IN ('waiting')"


def test_the_status_sets_are_the_tables_own() -> None:
    assert TERMINAL_TURN == {s for s, targets in TURN_TRANSITIONS.items() if not targets}
    assert TERMINAL_EXECUTION == {s for s, targets in EXECUTION_TRANSITIONS.items() if not targets}
    assert OPEN_EXECUTION == {ExecutionStatus.INTENDED, ExecutionStatus.ACCEPTED, ExecutionStatus.RUNNING}
    assert UNSETTLED_EXECUTION == OPEN_EXECUTION | {ExecutionStatus.PENDING}
    assert sql.TERMINAL_SQL == "('cancelled', 'completed', 'failed')"
    assert sql.FINAL_SQL == "('cancelled', 'failed', 'succeeded')"
    assert sql.OPEN_SQL == "('accepted', 'intended', 'running')"
