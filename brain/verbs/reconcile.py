"""An operator's reconcile of an UNKNOWN execution, as a Brain takes it.

Only the Hands of the execution's route can resolve it: their ledger holds the execution, and the
audit row, the status move and the ``succeeded``/``failed`` event with ``how="reconciled"`` are
one transaction there (``hands.run.reconcile``). So the Brain sends them a ``reconcile`` control on
the route's control queue, and learns the outcome as it learns every other, from that event; it
never opens their ledger.

The control is recorded on the execution's turn like every control (a receipt, ``applied`` once it
is on its way, and its journal fact) and committed to the controls outbox in the same transaction:
the control relay publishes it after the commit and again until the broker confirmed it. It is
idempotent by request id, per turn, like every control: the same request id with the same input is
the same control (nothing new is sent), with another input a CONFLICT. Its message id is derived
from the execution and the request id, so whatever sends it twice sends one message, and the Hands
take the second delivery as a duplicate of their audit row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from brain.rules import facts
from brain.rules.records import Control
from brain.rules.states import ExecutionStatus
from brain.rules.submits import shown_session
from brain.store import BrainStore
from brain.verbs.controls import locked_turn
from infra.db import Connection
from infra.objects.payloads import PayloadCodec
from infra.transport import Topology
from protocol import (
    DecodeError,
    IllegalTransitionError,
    NotFoundError,
    ReconcileBody,
    ReconcileControl,
    SchemaError,
    decode,
    digest,
    dumps,
)
from protocol.storable import unstorable

KIND = "reconcile"


@dataclass(frozen=True)
class Requested:
    """A reconcile the Brain took: where it went, and what to publish now (nothing for a request
    id that asked before: its control is in the outbox already)."""

    execution_id: str
    turn_id: str
    route: str
    request_id: str
    controls: list[Control]


def message_id(execution_id: str, request_id: str) -> str:
    """The control's message id: the same for the same request, whoever sends it."""
    return digest({"kind": KIND, "execution_id": execution_id, "request_id": request_id})[:32]


def reconcile_body(*, request_id: str, evidence: str, actor: str, outcome: dict[str, Any]) -> ReconcileBody:
    """The control's body (``outcome``: ``{"result": ...}`` or ``{"failure": ...}``), refused here
    with a SchemaError when the Hands could not carry it out or store it."""
    given = {"request_id": request_id, "evidence": evidence, "actor": actor, **outcome}
    for name, value in given.items():
        problem = unstorable(value)
        if problem is not None:
            raise SchemaError(f"the reconcile's {name} cannot be stored: it {problem}")
    try:
        dumps(outcome)  # strict JSON: no NaN or infinity, no integer a double cannot hold
    except DecodeError as exc:
        raise SchemaError(f"the reconcile's result cannot be sent: {exc.message}") from exc
    if not evidence.strip():
        raise SchemaError("reconcile needs evidence: say how you know what happened")
    if not actor.strip():
        raise SchemaError("reconcile needs an actor: who is vouching for this")
    try:
        return ReconcileBody(request_id=request_id, evidence=evidence, actor=actor, **outcome)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "".join(f"{p}: " for p in first["loc"])
        raise SchemaError(where + first["msg"].removeprefix("Value error, ")) from exc


async def request(
    store: BrainStore,
    topology: Topology,
    execution_id: str,
    body: ReconcileBody,
    codec: PayloadCodec | None = None,
) -> Requested:
    """Take an operator's reconcile of ``execution_id`` (in any namespace) in one commit; with
    ``codec``, a body over its threshold goes to object storage first, as every big envelope does.

    Raises NotFoundError for an execution this Brain does not know, IllegalTransitionError for one
    its record says is not UNKNOWN (unless this request id asked before: then it is that request),
    and ConflictError for a request id its turn used for another control or input.
    """
    outcome = {"result": body.result} if body.succeeded else {"failure": body.failure}
    input_digest = digest({"kind": KIND, "execution_id": execution_id, "evidence": body.evidence,
                           "actor": body.actor, **outcome})  # fmt: skip
    # What the receipt keeps of it: the result and the evidence are the Hands' audit row's, and
    # the execution's once their event is applied.
    kept = {"execution_id": execution_id, "actor": body.actor,
            "outcome": "succeeded" if body.succeeded else "failed"}  # fmt: skip
    # Made (and its body stored, when big) before the transaction: its header is what never changes
    # of an execution, and an object no commit names is only an object nobody reads.
    control = await store.read(lambda conn: _control(store, conn, execution_id, body))
    if codec is not None:
        control = decode(await codec.pack(control))

    async def work(conn: Connection) -> Requested:
        execution = await _execution(store, conn, execution_id)
        seen = await store.turns.load(conn, execution["turn_id"])
        # Locked as every control of the turn is, with the receipt its request id may have already.
        turn, earlier = await locked_turn(store, conn, seen.namespace, seen.id, body.request_id, input_digest)
        execution = await _execution(store, conn, execution_id)  # as it is under the lock
        route = execution["route"]
        if earlier is not None:
            return Requested(execution_id, turn.id, route, body.request_id, [])
        if execution["status"] != ExecutionStatus.UNKNOWN:
            how = f" ({execution['how']})" if execution["how"] else ""
            raise IllegalTransitionError(
                f"execution {execution_id} is {execution['status'].upper()}{how}, not UNKNOWN: "
                "only an UNKNOWN execution can be reconciled"
            )
        queued = await store.outbox.add_control(conn, topology.controls(route), control)
        reason = f"sent to the Hands of route {route}"
        row = await store.controls.record_control(
            conn, turn.id, body.request_id, KIND, input_digest, kept, "applied", reason
        )
        await store.journal.append(
            conn, turn.session_id, turn.id, [facts.control(row["id"], KIND, "applied", reason)],
            thread_id=turn.thread_id, status=str(turn.status), phase=str(turn.phase),
        )  # fmt: skip
        return Requested(execution_id, turn.id, route, body.request_id, [queued])

    return await store.transact(work)


async def _execution(store: BrainStore, conn: Connection, execution_id: str) -> Any:
    found = await store.executions.executions_by_id(conn, [execution_id])
    if execution_id not in found:
        raise NotFoundError(f"there is no execution {execution_id!r}")
    return found[execution_id]


async def _control(
    store: BrainStore, conn: Connection, execution_id: str, body: ReconcileBody
) -> ReconcileControl:
    """The control for the Hands: the execution's header, the body, the request's message id."""
    execution = await _execution(store, conn, execution_id)
    turn = await store.turns.load(conn, execution["turn_id"])
    return ReconcileControl(
        message_id=message_id(execution_id, body.request_id),
        execution_id=execution_id,
        namespace=turn.namespace,
        session_id=shown_session(turn.namespace, turn.session_id),
        request_digest=execution["request_digest"],
        body=body,
    )


async def execution_status(store: BrainStore, execution_id: str) -> dict[str, Any]:
    """What the Brain's record says of an execution now: its status, and how and on what evidence
    it left UNKNOWN."""
    found = await store.read(lambda conn: store.executions.executions_by_id(conn, [execution_id]))
    row = found[execution_id]
    return {"status": row["status"], "how": row["how"], "evidence": row["evidence"]}
