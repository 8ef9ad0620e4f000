"""Controls: durable commands on a turn, each with a receipt and a later applied/rejected fact
(invariant 12). One place for the CLI and the HTTP API.

=========  ===================================================================================
control    what it does
=========  ===================================================================================
steer      adds guidance (seen by the model as an instruction) at the turn's next boundary:
           between model steps, never halfway through an answer, never undoing a dispatched
           tool
inject     adds user input the same way
withdraw   takes back a steer or inject not applied yet
pause      the turn stops at its next boundary (at once when no run holds it); its tool
           results are still applied, it just does not go on
resume     a paused turn goes on, if the caller saw its current revision
cancel     a queued turn (or one with nothing a Hands worker accepted) is cancelled at once;
           otherwise a cancel goes to each accepted execution's Hands and the turn ends
           CANCELLED once each is settled (cancelled, finished or UNKNOWN). Calls that no worker
           accepted are settled CANCELLED in the cancel's own commit, whether a pool serves
           their route or not, and their Hands get a cancel that stops a late command (the
           cancel guarantee: docs/design.md); a new message's interrupt or rollback is a cancel
           too (``brain.verbs.doubletext``)
respond    a person's answer to a call that waits for one: approve or deny it, or give a
           manual tool's result
=========  ===================================================================================

Each is idempotent by its request id (per turn): the same request id with the same input answers
the original receipt, as it stands now; with another input it is a CONFLICT. What a control does to a
turn in a given state is a pure rule: ``brain.rules.controls.decide``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from brain.rules import facts, waits
from brain.rules.controls import INPUTS, Kind, Outcome, TurnView, at_boundary, decide
from brain.rules.names import MAX_ID, MAX_REQUEST_ID, check_id
from brain.rules.states import ACCEPTED_EXECUTION, TERMINAL_TURN, TurnStatus
from brain.store import BrainStore, Control, TurnRow
from brain.verbs import inputs
from infra.db import Connection, Json
from infra.transport import Topology
from protocol import ConflictError, NotFoundError, SchemaError, digest
from protocol.storable import unstorable


@dataclass(frozen=True)
class Receipt:
    """What a control's caller gets back: its id and where it stands."""

    control_id: int
    turn_id: str
    kind: str
    request_id: str
    status: str
    reason: str | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Receipt:
        return cls(row["id"], row["turn_id"], row["kind"], row["request_id"], row["status"], row["reason"])

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _body(kind: Kind, text: str | None, revision: int | None, target: int | None) -> dict[str, Any]:
    if kind in INPUTS:
        if not text:
            raise SchemaError(f"a {kind} needs the text to add")
        problem = unstorable(text)
        if problem is not None:
            raise SchemaError(f"the {kind} text cannot be stored: its text {problem}")
        return {"text": text}
    if kind is Kind.RESUME:
        if revision is None:
            raise SchemaError("a resume needs the turn's revision the caller saw (`brain show TURN`)")
        return {"revision": revision}
    if kind is Kind.WITHDRAW:
        if target is None:
            raise SchemaError("a withdraw needs the id of the steer or inject to take back")
        return {"control_id": target}
    return {}


async def control(
    store: BrainStore,
    *,
    namespace: str,
    turn_id: str,
    request_id: str,
    kind: Kind,
    topology: Topology,
    wake_channel: str,
    text: str | None = None,
    revision: int | None = None,
    target: int | None = None,
    ended: Callable[[str, str, datetime], None] | None = None,
    send: Callable[[list[Control]], object] | None = None,
) -> Receipt:
    """Record a control on a turn and do what it does now (one commit); returns its receipt.
    ``ended``: told (turn id, status, when the turn was accepted) once a control that ended the
    turn in its own commit (a cancel with nothing running) committed. ``send``: hands the cancels
    that commit put in the outbox to a relay to publish now (else a serving Brain's relay sweep
    publishes them)."""
    check_id("request id", request_id, MAX_REQUEST_ID)
    body = _body(kind, text, revision, target)
    input_digest = digest({"kind": str(kind), **body})
    ends: list[TurnRow] = []
    queued: list[Control] = []

    async def work(conn: Connection) -> Receipt:
        ends.clear()  # a transaction tried again starts over
        queued.clear()
        turn, earlier = await locked_turn(store, conn, namespace, turn_id, request_id, input_digest)
        if earlier is not None:
            return earlier
        if kind is Kind.WITHDRAW:
            return await _withdraw(store, conn, turn, request_id, body, input_digest)
        receipt = await record(
            store, conn, turn, kind, body, request_id, input_digest, topology, wake_channel, queued
        )
        if kind is Kind.CANCEL and receipt.status == "applied":
            ends.append(turn)
        return receipt

    receipt = await store.transact(work)
    if ended is not None:
        for turn in ends:
            ended(turn.id, str(TurnStatus.CANCELLED), turn.created_at)
    if queued and send is not None:
        send(list(queued))
    return receipt


async def locked_turn(
    store: BrainStore, conn: Connection, namespace: str, turn_id: str, request_id: str, input_digest: str
) -> tuple[TurnRow, Receipt | None]:
    """The turn, locked for the control's commit, and the receipt its request id already has
    (CONFLICT when that was for another input)."""
    turn = await store.turns.lock_turn(conn, namespace, turn_id)
    if turn is None:
        raise NotFoundError(f"there is no turn {turn_id!r}")
    earlier = await store.controls.control_by_request(conn, turn_id, request_id)
    if earlier is not None and earlier["input_digest"] != input_digest:
        raise ConflictError(
            f"request id {request_id!r} of turn {turn_id} was already used for another control "
            f"({earlier['kind']} #{earlier['id']})"
        )
    return turn, Receipt.of(earlier) if earlier is not None else None


async def record(
    store: BrainStore,
    conn: Connection,
    turn: TurnRow,
    kind: Kind,
    body: dict[str, Any],
    request_id: str,
    input_digest: str,
    topology: Topology,
    wake_channel: str,
    queued: list[Control],
    *,
    why: str | None = None,
    note: Sequence[dict[str, Any]] = (),
) -> Receipt:
    """Decide a new control by the turn as it stands, record it with its receipt, do what it does
    now, and journal what it did (and ``note``); the cancels it put in the outbox go to ``queued``.
    ``why``: a cancel's reason, for its receipt and the calls it settles (a new turn's
    interrupt: ``brain.verbs.doubletext``)."""
    received = await store.controls.controls_of(conn, turn.id, received_only=True)
    accepted = [
        e for e in await store.executions.open_executions(conn, turn.id) if e["status"] in ACCEPTED_EXECUTION
    ]
    view = TurnView(
        status=turn.status,
        leased=turn.lease_owner is not None,
        revision=turn.revision,
        accepted_executions=len(accepted),
        cancelling=turn.cancel_requested,
        pause_pending=any(c["kind"] == Kind.PAUSE for c in received),
    )
    outcome, reason = decide(kind, view, body)
    reason = reason or why
    later = at_boundary(kind, view, body)  # an interrupt that lets the model call in flight finish
    row = await store.controls.record_control(
        conn, turn.id, request_id, str(kind), input_digest, body, str(outcome), reason
    )
    said = [facts.control(row["id"], str(kind), str(outcome), reason)]
    if kind is Kind.CANCEL and outcome is not Outcome.REJECT and not turn.cancel_requested and not later:
        # What no Hands worker accepted is settled now, whatever the outcome: nothing waits for it.
        controls, settled = await store.controls.settle_not_accepted(conn, turn, topology, why)
        queued += controls
        said += settled
    if outcome is Outcome.DEFER:
        await store.controls.add_pending(conn, turn.id, 1)
        if kind is Kind.CANCEL and not turn.cancel_requested and not later:
            # The cancels for the Hands are outbox rows: the Brains' control relays send them.
            told = why or "its turn was cancelled"
            queued += await store.controls.begin_cancel(conn, turn, accepted, topology, told)
            said.append(facts.waiting(f"{len(accepted)} execution(s) to settle after a cancel"))
    elif outcome is Outcome.APPLY:
        said += await _apply_now(store, conn, turn, kind, received, wake_channel, why)
    status = await store.turns.status_of(conn, turn.id)
    await store.journal.append(
        conn, turn.session_id, turn.id, [*said, *note], thread_id=turn.thread_id, status=status,
        phase=str(turn.phase),
    )  # fmt: skip
    return Receipt.of(row)


async def _apply_now(
    store: BrainStore, conn: Connection, turn: TurnRow, kind: Kind, received: list[Any], wake_channel: str,
    why: str | None,
) -> list[dict[str, Any]]:  # fmt: skip
    """What an applied pause, resume or cancel does in the control's own commit; its facts."""
    if kind is Kind.PAUSE:
        if turn.status is not TurnStatus.PAUSED:
            await store.controls.pause_now(conn, turn)
        return []
    if kind is Kind.RESUME:
        pauses = [c["id"] for c in received if c["kind"] == Kind.PAUSE]
        if pauses:  # a pause that waited for the boundary is taken back
            await store.controls.decide_controls(conn, pauses, "rejected", "withdrawn by a resume")
            await store.controls.add_pending(conn, turn.id, -len(pauses))
        if turn.status is TurnStatus.PAUSED:
            await store.controls.resume_now(conn, turn, wake_channel)
        return [facts.control(c, "pause", "rejected", "withdrawn by a resume") for c in pauses]
    assert kind is Kind.CANCEL
    closed = await store.controls.cancel_now(conn, turn, why)
    others = [c["id"] for c in received]
    await store.controls.decide_controls(conn, others, "rejected", "the turn was cancelled")
    said = [facts.control(c["id"], c["kind"], "rejected", "the turn was cancelled") for c in received]
    return [*closed, *said, facts.cancelled_turn()]


async def _withdraw(
    store: BrainStore, conn: Connection, turn: TurnRow, request_id: str, body: dict[str, Any], in_digest: str
) -> Receipt:
    target = await store.controls.control_by_id(conn, turn.id, body["control_id"])
    if target is None or target["kind"] not in INPUTS:
        reason: str | None = f"turn {turn.id} has no steer or inject #{body['control_id']}"
    elif target["status"] != "received":
        reason = f"{target['kind']} #{target['id']} was {target['status']} already"
    else:
        reason = None
    status = "rejected" if reason else "applied"
    row = await store.controls.record_control(
        conn, turn.id, request_id, str(Kind.WITHDRAW), in_digest, body, status, reason
    )
    said = [facts.control(row["id"], str(Kind.WITHDRAW), status, reason)]
    if reason is None:
        await store.controls.decide_controls(
            conn, [target["id"]], "withdrawn", f"withdrawn by control #{row['id']}"
        )
        await store.controls.add_pending(conn, turn.id, -1)
        said.append(
            facts.control(target["id"], target["kind"], "withdrawn", f"withdrawn by control #{row['id']}")
        )
    await store.journal.append(
        conn, turn.session_id, turn.id, said, thread_id=turn.thread_id, status=str(turn.status),
        phase=str(turn.phase),
    )  # fmt: skip
    return Receipt.of(row)


async def receipts(store: BrainStore, *, namespace: str, turn_id: str) -> list[Receipt]:
    """A turn's controls, in the order they came, as they stand."""

    async def read(conn: Connection) -> list[Any]:
        if await store.turns.lock_turn(conn, namespace, turn_id, lock=False) is None:
            raise NotFoundError(f"there is no turn {turn_id!r}")
        return await store.controls.controls_of(conn, turn_id)

    return [Receipt.of(r) for r in await store.read(read)]


# ---- approvals and manual tools ---------------------------------------------------------------

DECISIONS = ("approve", "deny", "result")


async def respond(
    store: BrainStore,
    *,
    namespace: str,
    turn_id: str,
    request_id: str,
    call: str,
    decision: str,
    wake_channel: str,
    result: Any = None,
    reason: str | None = None,
    topology: Topology | None = None,
) -> Receipt:
    """A person's answer to a call that waits for one: ``approve`` (it is sent to its Hands),
    ``deny`` (it fails, and the model is told why), or ``result`` (a manual tool's outcome); to a
    running call that asks for input, ``result`` or ``deny`` (``brain.verbs.inputs``).
    Idempotent by request id like every control; an answer to a call that is not waiting any more
    is rejected, saying how it was resolved."""
    if decision not in DECISIONS:
        raise SchemaError(f"a response is one of {', '.join(DECISIONS)}, not {decision!r}")
    check_id("request id", request_id, MAX_REQUEST_ID)
    check_id("call id", call, MAX_ID)
    for what, value in (("result", result if decision == "result" else None), ("reason", reason)):
        if unstorable(value) is not None:
            raise SchemaError(f"the {what} cannot be stored: its text {unstorable(value)}")
    body: dict[str, Any] = {"call": call, "decision": decision}
    if decision == "result":
        body["result"] = result
    if reason:
        body["reason"] = reason
    input_digest = digest({"kind": "respond", **body})

    async def work(conn: Connection) -> Receipt:
        turn, earlier = await locked_turn(store, conn, namespace, turn_id, request_id, input_digest)
        if earlier is not None:
            return earlier
        execution = await store.executions.execution_for_call(conn, turn_id, call)
        why = _refuse_response(turn, execution, call, decision)
        if inputs.awaits_input(execution) and turn.status not in TERMINAL_TURN:
            why = inputs.refused(execution, decision, topology)
        status = "rejected" if why else "applied"
        row = await store.controls.record_control(
            conn, turn_id, request_id, "respond", input_digest, body, status, why
        )
        said = [facts.control(row["id"], "respond", status, why)]
        if why is None and inputs.awaits_input(execution):
            given = await inputs.give(store, conn, turn, execution, body, request_id, topology)
            said += [given] if given else []
        elif why is None:
            said.append(await _answer(store, conn, turn, execution, decision, body, row["id"], wake_channel))
        await store.journal.append(
            conn, turn.session_id, turn_id, said, thread_id=turn.thread_id,
            status=await store.turns.status_of(conn, turn_id), phase=str(turn.phase),
        )  # fmt: skip
        return Receipt.of(row)

    return await store.transact(work)


def _refuse_response(turn: TurnRow, execution: Any, call: str, decision: str) -> str | None:
    """Why an answer cannot be taken (a pure rule), or None."""
    if turn.status in TERMINAL_TURN:
        return f"the turn is {turn.status} already"
    if execution is None:
        return f"the turn has no call {call!r}"
    if execution["status"] != "pending":
        how = f" ({execution['how']})" if execution["how"] else ""
        return f"call {execution['call_id']} waits for no answer: it is {execution['status']}{how}"
    awaits = (execution["how"] or "").removeprefix("awaiting_")
    if awaits in ("batch", "admission"):  # brain.rules.batches: its calls answer it, no person
        return f"call {execution['call_id']} is part of a batch: its calls answer it, not a person"
    if awaits in ("clock", "signal", "child"):  # its clock, a signal or its child answers it, no person
        what = {"clock": "its time", "signal": "a signal", "child": "its child turn"}[awaits]
        return f"call {execution['call_id']} waits for {what}, not a person"
    if awaits == "approval" and decision == "result":
        return f"call {execution['call_id']} waits for an approval (approve or deny), not a result"
    if awaits == "result" and decision == "approve":
        return f"call {execution['call_id']} of manual tool {execution['tool']} needs a result (or a denial)"
    return None


async def _answer(
    store: BrainStore,
    conn: Connection,
    turn: TurnRow,
    execution: Any,
    decision: str,
    body: Mapping[str, Any],
    control_id: int,
    wake_channel: str,
) -> dict[str, Any]:
    """What the answer does to the execution; its fact."""
    who = f"answered by a person (control #{control_id})"
    e = execution
    if decision == "approve" and e["route"] == waits.ROUTE:  # request_approval: its result says so
        await store.controls.settle_by_hand(conn, e, status="succeeded", how="approved",
            result=Json({"approved": True}), error=None, evidence=who, wake_channel=wake_channel)  # fmt: skip
        return facts.execution_event("succeeded", e["id"], e["call_id"], e["tool"], how="approved")
    if decision == "approve":
        await store.controls.approve(conn, turn.id, e["id"])
        return facts.execution_event("approved", e["id"], e["call_id"], e["tool"])
    if decision == "deny":
        message = body.get("reason") or "a person denied this call"
        error = {"code": "denied", "message": message}
        await store.controls.settle_by_hand(conn, e, status="failed", how="denied", result=None, error=error,
                                   evidence=who, wake_channel=wake_channel)  # fmt: skip
        return facts.execution_event("failed", e["id"], e["call_id"], e["tool"], how="denied")
    await store.controls.settle_by_hand(
        conn, e, status="succeeded", how="manual", result=Json(body["result"]), error=None, evidence=who,
        wake_channel=wake_channel,
    )  # fmt: skip
    return facts.execution_event("succeeded", e["id"], e["call_id"], e["tool"], how="manual")
