"""What the Hands ledger takes and gives: plain records, the same on every backend."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any

from hands.rules.states import OPEN_STATUSES, LedgerStatus


@dataclass(frozen=True)
class Execution:
    """One row of ``executions``: the command, status, owner, attempts and its status events.

    ``events``: the packed envelopes (JSON data, ``body`` or ``body_ref``) of its status events, in
    seq order, exactly as they were published; output pages are in ``output_chunks``.
    """

    execution_id: str
    route: str
    request_digest: str
    namespace: str
    session_id: str
    turn_id: str | None
    call_id: str | None
    tool: str | None
    binding_digest: str | None
    replay_policy: str | None
    args: dict[str, Any] | None
    status: LedgerStatus
    owner: str
    attempts: int
    last_seq: int
    events: list[dict[str, Any]]
    error: dict[str, str] | None
    output_bytes: int
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime
    handle: str | None = None  # what its body committed to re-attach by (``Ledger.keep_handle``)
    inputs: str | None = (
        None  # JSON: the answers a person gave to what it asked, by key (``Ledger.give_input``)
    )
    wake_at: datetime | None = None  # parked until then (``Ledger.park``); None: not parked

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Execution:
        data = {f.name: rec[f.name] for f in fields(cls)}
        data["status"] = LedgerStatus(data["status"])
        data["events"] = list(data["events"] or [])
        return cls(**data)

    @property
    def header(self) -> dict[str, str]:
        """What every event of this execution carries besides its seq and body."""
        return {
            "namespace": self.namespace,
            "session_id": self.session_id,
            "request_digest": self.request_digest,
        }

    @property
    def result(self) -> Any:
        """The result its ``succeeded`` event carries (None without one, or by reference)."""
        for event in reversed(self.events):
            if event.get("kind") == "succeeded":
                return (event.get("body") or {}).get("result")
        return None

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly view (for ``hands show``)."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "events"}
        out["status"] = self.status.value
        out["result"] = self.result
        out["created_at"] = self.created_at.isoformat()
        out["updated_at"] = self.updated_at.isoformat()
        out["wake_at"] = self.wake_at.isoformat() if self.wake_at is not None else None
        return out


# The columns an Execution is read from.
EXECUTION_COLUMNS = ", ".join(f.name for f in fields(Execution))
# What an insert asks back (``NewExecution.inserted``); a new row has every other column as given.
STAMPED = ("execution_id", "attempts", "output_bytes", "cancel_requested", "created_at", "updated_at")
_GIVEN = tuple(f.name for f in fields(Execution) if f.name not in (*STAMPED, "status", "last_seq", "events"))


@dataclass(frozen=True)
class NewExecution:
    """A row to insert (accepted, or rejected, or a tombstone) with its first events."""

    values: dict[str, Any]  # column -> value (execution_id, route, status, owner, ...)
    events: list[dict[str, Any]]  # packed envelopes, seq 1..n

    @property
    def execution_id(self) -> str:
        return str(self.values["execution_id"])

    def inserted(self, stamped: Mapping[str, Any]) -> Execution:
        """The row this insert wrote: what the store made of it (``STAMPED``: its stamps
        and the columns a new row takes from their defaults unless given) from ``stamped``, the
        rest as given here."""
        data: dict[str, Any] = {name: self.values.get(name) for name in _GIVEN}
        data |= {name: stamped[name] for name in STAMPED}
        data |= {"status": LedgerStatus(self.values["status"]), "last_seq": len(self.events)}
        return Execution(**data, events=list(self.events))


@dataclass(frozen=True)
class Change:
    """A guarded status change of a row as its owner knew it, with the events it appends.

    Applied only while the stored row still has ``before``'s owner, status and last seq (and,
    with ``unless_cancelled``, no cancel asked for); else it changes nothing and the caller looks
    at the row again under a lock.
    """

    before: Execution
    status: LedgerStatus
    events: list[dict[str, Any]]  # packed envelopes, seq last_seq + 1, ...
    attempts: int | None = None
    error: dict[str, str] | None = None
    output_bytes: int | None = None
    unless_cancelled: bool = False

    @property
    def open(self) -> bool:
        return self.status in OPEN_STATUSES

    def after(self, updated_at: datetime, cancel_requested: bool) -> Execution:
        """The row as this change, once applied, left it: what the store stamped (``updated_at``)
        and what others may set beside the guard (``cancel_requested``) come from the row; the
        rest is ``before`` moved on, since the guard that let the change through (owner, status
        and last seq as ``before`` has them) proves the stored row was ``before``: every other
        write of these columns moves the status or the last seq too."""
        b = self.before
        return replace(
            b,
            status=self.status,
            attempts=b.attempts if self.attempts is None else self.attempts,
            error=b.error if self.error is None else self.error,
            output_bytes=b.output_bytes if self.output_bytes is None else self.output_bytes,
            last_seq=b.last_seq + len(self.events),
            events=[*b.events, *self.events],
            cancel_requested=cancel_requested,
            updated_at=updated_at,
        )
