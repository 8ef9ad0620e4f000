"""The SQL spellings the store's parts share: the status sets and guarded status writes, derived
from the state tables (``brain.rules.states``), and the column lists records are read from.

A status is written only through :func:`turn_becomes` or :func:`execution_becomes`: the write's
``SET`` and a guard (``WHERE status IN (...)``) made from the states the table lets move to the
new one. A write the table forbids fails when the module loads, not in production; a row in a
state the table does not allow to move is left as it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from brain.rules.delegation import DELEGATION_TRANSITIONS, DelegationStatus
from brain.rules.states import (
    CONTROL_TRANSITIONS,
    EXECUTION_TRANSITIONS,
    OPEN_EXECUTION,
    SEQUENCED_EXECUTION,
    TERMINAL_EXECUTION,
    TERMINAL_TURN,
    TURN_TRANSITIONS,
    UNSETTLED_EXECUTION,
    ControlStatus,
    ExecutionStatus,
    TurnStatus,
    sources,
)
from infra.liveness import ALIVE_SQL
from protocol import IllegalTransitionError

E = TypeVar("E", bound=StrEnum)


def in_list(statuses: Iterable[StrEnum]) -> str:
    """``('a', 'b')``: a set of statuses as SQL's IN list (sorted, so a statement's text is stable)."""
    return "(" + ", ".join(f"'{s}'" for s in sorted(str(s) for s in statuses)) + ")"


TERMINAL_SQL = in_list(TERMINAL_TURN)  # a turn's final statuses
FINAL_SQL = in_list(TERMINAL_EXECUTION)  # an execution's
OPEN_SQL = in_list(OPEN_EXECUTION)  # what the Hands may still be working on
UNSETTLED_SQL = in_list(UNSETTLED_EXECUTION)  # ... and what waits for a person
SEQUENCED_SQL = in_list(SEQUENCED_EXECUTION)  # whose events are still applied in order


@dataclass(frozen=True)
class StatusWrite:
    """A status write the state table allows: what to ``SET``, and the guard for ``WHERE``."""

    set: str  # status = 'new'
    guard: str  # [alias.]status IN (the states it may come from)


def _becomes(
    table: dict[E, frozenset[E]], new: E, from_: Iterable[E] | None, alias: str, what: str
) -> StatusWrite:
    allowed = set(sources(table, new))
    olds = {str(s) for s in from_} if from_ is not None else allowed
    if not olds or not olds <= allowed:
        raise IllegalTransitionError(
            f"{what} cannot move from {sorted(olds - allowed) or 'nowhere'} to {new}"
        )
    column = f"{alias}.status" if alias else "status"
    return StatusWrite(f"status = '{new}'", f"{column} IN ({', '.join(repr(s) for s in sorted(olds))})")


def turn_becomes(
    new: TurnStatus, *, from_: Iterable[TurnStatus] | None = None, alias: str = ""
) -> StatusWrite:
    """A turn status write: to ``new`` from ``from_`` (default: every state the table lets move
    there); ``alias``: the turns table's alias in the statement's WHERE."""
    return _becomes(TURN_TRANSITIONS, new, from_, alias, "a turn")


def execution_becomes(
    new: ExecutionStatus, *, from_: Iterable[ExecutionStatus] | None = None, alias: str = ""
) -> StatusWrite:
    """An execution status write, as :func:`turn_becomes`."""
    return _becomes(EXECUTION_TRANSITIONS, new, from_, alias, "an execution")


def delegation_becomes(new: DelegationStatus) -> StatusWrite:
    """A delegation record's status write (``brain.rules.delegation``), as :func:`turn_becomes`."""
    return _becomes(DELEGATION_TRANSITIONS, new, None, "", "a delegation")


def control_becomes(new: ControlStatus) -> StatusWrite:
    """A control's status write (from ``received``: a decided control stays as it was decided)."""
    return _becomes(CONTROL_TRANSITIONS, new, None, "", "a control")


def owner_not_dead(owner: str) -> str:
    """Whether the worker ``owner`` (an SQL expression) is not recorded dead: a Brain presumed dead
    takes no turn. One frozen past its lease wakes and applies the updates it held before it
    learns it lost its liveness, and would claim the turns they woke under its dead id, to wait
    out a lease there."""
    return f"NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = {owner} AND NOT {ALIVE_SQL})"


# The columns of ``turns`` a TurnRow is read from, for statements that return turns.
TURN_COLUMNS = (
    "id, namespace, session_id, thread_id, request_id, status, phase, revision, lease_owner, lease_epoch,"
    " waiting_for, model_calls, tool_step, retries, runs, result, error, created_at, crashes, crash_at,"
    " pending, cancel_requested, model_attempt"
)
# What a turn's description shows of each of its executions (and its conversation's tool messages).
VIEW_EXECUTION_COLUMNS = (
    "id, call_id, tool, route, status, attempts, how, evidence, result, error, last_seq, tool_step, worker,"
    " output_bytes, created_at, updated_at, input_request"
)
JOURNAL_COLUMNS = "session_id, seq, thread_id, turn_id, run, status, phase, facts, created_at"
CONTROL_COLUMNS = "id, turn_id, request_id, kind, input_digest, body, status, reason, created_at, decided_at"


def column_names(columns: str) -> list[str]:
    """The names in a comma-separated column list (``TURN_COLUMNS``...)."""
    return [c.strip() for c in columns.split(",")]


def qualified(alias: str, columns: str) -> str:
    """A comma-separated column list with each name as ``alias.name``."""
    return ", ".join(f"{alias}.{c}" for c in column_names(columns))
