"""Resolving an UNKNOWN execution by hand: a result (or a failure) plus evidence, audited.

Only a person who checked the external system can say what happened to an operation the
pool could not verify (invariant 6). The resolution is one transaction: an audit row in
``reconciliations``, the status move UNKNOWN -> SUCCEEDED/FAILED (allowed only here), and
the ``succeeded``/``failed`` event with ``how="reconciled"`` and the evidence.

It comes from ``hands reconcile`` or, for an operator's request through a Brain's HTTP API, as a
``reconcile`` control on the route's control queue (``hands.run.controls``). Such a request
carries the operator's request id, kept in the audit row: the same request again (repeated, or
redelivered) is answered as a duplicate with what it did the first time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hands.rules.states import LedgerStatus
from hands.run.writer import LedgerWriter
from hands.store import Change, Execution, Ledger
from infra.db import Connection
from infra.objects.payloads import PayloadCodec
from infra.transport import Transport
from protocol import (
    FailedBody,
    IllegalTransitionError,
    NotFoundError,
    SchemaError,
    SucceededBody,
    batch_bytes,
)

_NO_RESULT = object()


@dataclass(frozen=True)
class Reconciliation:
    """What a reconcile did: the row now, its audit row, and the seq of its event (the event
    itself, to publish). ``duplicate``: the request id's reconcile was made before, and this is
    what it did then (its event went out then, or goes with the relay's sweep)."""

    execution: Execution
    audit_id: int
    seq: int
    event: dict[str, Any]
    duplicate: bool = False


async def reconcile(
    ledger: Ledger,
    codec: PayloadCodec,
    execution_id: str,
    *,
    evidence: str,
    actor: str,
    result: Any = _NO_RESULT,
    failure: str | None = None,
    request_id: str | None = None,
) -> Reconciliation:
    """Resolve UNKNOWN ``execution_id`` as succeeded with ``result`` or failed with ``failure``.

    Raises NotFoundError for an id not in the ledger and IllegalTransitionError (naming the
    status) for an execution that is not UNKNOWN, unless ``request_id`` made its reconcile: then
    that one is returned, as a duplicate. The caller publishes the event (:func:`publish`); until
    that is confirmed (``reconciliation_sent``), the pool's relay sends it from the ledger.
    """
    _check(evidence, actor, has_result=result is not _NO_RESULT, failure=failure)
    succeeded = failure is None
    error = None if succeeded else {"code": "reconciled_failure", "message": failure or ""}
    writer = LedgerWriter(ledger, codec, lambda events: None)

    async def work(conn: Connection) -> Reconciliation:
        row = await ledger.get(conn, execution_id, for_update=True)
        if row is None:
            raise NotFoundError(f"execution {execution_id} is not in the ledger")
        if row.status is not LedgerStatus.UNKNOWN:
            earlier = await _made_by(ledger, conn, row, request_id)
            if earlier is not None:
                return earlier
            raise IllegalTransitionError(
                f"execution {execution_id} is {row.status.value.upper()}, not UNKNOWN: "
                "only an UNKNOWN execution can be reconciled"
            )
        outcome = LedgerStatus.SUCCEEDED if succeeded else LedgerStatus.FAILED
        audit_id = await ledger.insert_reconciliation(
            conn,
            execution_id,
            outcome=outcome,
            result=None if not succeeded else result,
            error=error,
            evidence=evidence,
            actor=actor,
            request_id=request_id,
        )
        body = (
            SucceededBody(result=result, output_bytes=row.output_bytes, how="reconciled", evidence=evidence)
            if error is None
            else FailedBody(error=error, output_bytes=row.output_bytes, how="reconciled", evidence=evidence)
        )
        event = await writer.event(execution_id, row.header, row.last_seq + 1, body)
        updated = await ledger.reconcile(conn, Change(row, outcome, [event], error=error))
        return Reconciliation(updated, audit_id, event["seq"], event)

    return await ledger.transact(work)


def _check(evidence: str, actor: str, *, has_result: bool, failure: str | None) -> None:
    """Refuse a reconcile that does not say what happened, how it is known, and who vouches."""
    if has_result == (failure is not None):
        raise SchemaError("reconcile needs exactly one of a result or a failure message")
    if not evidence.strip():
        raise SchemaError("reconcile needs evidence: say how you know what happened")
    if not actor.strip():
        raise SchemaError("reconcile needs an actor: who is vouching for this")


async def _made_by(
    ledger: Ledger, conn: Connection, row: Execution, request_id: str | None
) -> Reconciliation | None:
    """The reconcile ``request_id`` made of this execution, if it made one."""
    if request_id is None:
        return None
    for audit in await ledger.list_reconciliations(conn, row.execution_id):
        if audit["request_id"] == request_id:
            event = next(e for e in reversed(row.events) if e["kind"] in ("succeeded", "failed"))
            return Reconciliation(row, audit["id"], event["seq"], event, duplicate=True)
    return None


async def publish(ledger: Ledger, broker: Transport, done: Reconciliation) -> None:
    """Publish a reconcile's event on ``updates`` and record that it went out. If this raises (or
    the process dies first), the pool's relay publishes it from the ledger (``EventRelay.sweep``)."""
    event = done.event
    await broker.publish(broker.topology.updates, batch_bytes([event]), message_id=event["message_id"])
    await ledger.transact(lambda conn: ledger.reconciliation_sent(conn, done.audit_id))
