"""Batches on the Brain's side (``brain.rules.batches``): the manifest frozen with the commit that
accepts a batch call, and admission: the next children made INTENDED (their commands, packed at
acceptance, are in their rows), the rest skipped after a failure in fail-fast mode, and the batch
call settled with its report once nothing it admitted is open.

Admission runs under the turn's row lock, in the transaction that applied the children's ends
(``brain.run.batches``), or in the repair scan's (a batch whose apply was lost): so two siblings
ending at once never admit past the limit, and a cancel of the turn (which takes the same lock and
settles the children not admitted) is never followed by an admission. A paused turn admits
nothing; once resumed, the repair scan's look at the open batches admits again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from brain.rules import facts
from brain.rules.batches import FAILED, FINAL, IN_FLIGHT, NAME, first_failure, next_step, parent_of, report
from brain.rules.records import Intent
from brain.rules.states import TERMINAL_TURN, WAITING_FOR_A_PERSON, ExecutionStatus, TurnStatus
from brain.store.part import Part
from brain.store.sql import execution_becomes
from infra.db import Connection, Json

_ADMITTED = execution_becomes(ExecutionStatus.INTENDED, from_=WAITING_FOR_A_PERSON)
_SKIPPED = execution_becomes(ExecutionStatus.CANCELLED, from_=WAITING_FOR_A_PERSON)
_BATCH = """SELECT b.id, b.turn_id, b.call_id, b.tool, b.mode, b.at_once, b.on_failure, b.size,
                   e.status, e.tool_step
              FROM batches b JOIN executions e ON e.id = b.id WHERE b.id = $1 AND b.open"""
# What admission reads of each child (its result only once the batch settles: a batch of many
# calls reads its children's statuses at each end, not their results).
_ADMISSION_COLUMNS = "id, call_id, tool, status"
_REPORT_COLUMNS = "id, call_id, tool, status, how, result, error"


@dataclass
class Admitted:
    """What admission did in one transaction: the commands to send once it committed
    (queue-less: the caller knows the topology) and the batches it settled."""

    commands: list[tuple[str, bytes, str]] = field(default_factory=list)  # route, command, message id
    settled: list[str] = field(default_factory=list)


class Batches(Part):
    async def freeze(self, conn: Connection, turn_id: str, intents: Iterable[Intent]) -> None:
        """The manifests of the batch calls among ``intents``, in the transaction that commits
        them (their children are among the intents, with their commands)."""
        for i in intents:
            if i.batch is None:
                continue
            m = i.batch
            await conn.execute(
                """INSERT INTO batches (id, turn_id, call_id, tool, mode, at_once, on_failure, size, items,
                                        binding)
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (id) DO NOTHING""",
                i.execution_id, turn_id, i.call_id, m["tool"], m["mode"], m["limit"], m["on_failure"],
                len(m["items"]), Json(list(m["items"])), Json(dict(m["binding"])),
            )  # fmt: skip

    async def open_batches(self, conn: Connection, limit: int = 100) -> list[str]:
        """Batches not settled yet, oldest first (what the repair scan looks at)."""
        rows = await conn.fetch("SELECT id FROM batches WHERE open ORDER BY created_at LIMIT $1", limit)
        return [r["id"] for r in rows]

    async def advance(
        self, conn: Connection, batch_ids: Sequence[str], *, owner: str, wake_channel: str
    ) -> Admitted:
        """Admit, skip and settle what each batch's children allow now. The turn of each is locked
        first (the apply that calls this holds it already; a scan skips one another holds)."""
        done = Admitted()
        for batch_id in sorted(set(batch_ids)):
            await self._advance(conn, batch_id, owner, wake_channel, done)
        return done

    async def _advance(
        self, conn: Connection, batch_id: str, owner: str, wake_channel: str, done: Admitted
    ) -> None:
        turn_id = await conn.fetchval("SELECT turn_id FROM batches WHERE id = $1 AND open", batch_id)
        if turn_id is None:
            return
        turn = await conn.fetchrow(
            f"SELECT session_id, thread_id, status, phase, cancel_requested FROM turns WHERE id = $1"
            f"{self.store.SKIP_LOCKED}",
            turn_id,
        )
        if turn is None:
            return  # another transaction holds the turn: it (or the next scan) goes on
        b = await conn.fetchrow(_BATCH, batch_id)  # read under the turn's lock
        if b is None:
            return
        if b["status"] != ExecutionStatus.PENDING:  # its turn was cancelled or failed: nothing more
            await conn.execute("UPDATE batches SET open = false WHERE id = $1", batch_id)
            return
        if turn["status"] in TERMINAL_TURN or turn["cancel_requested"]:
            return
        children = await self._children(conn, b, _ADMISSION_COLUMNS)
        step = next_step(b["mode"], b["at_once"], b["on_failure"], [c["status"] for c in children])
        if turn["status"] == TurnStatus.PAUSED:  # nothing new starts until a resume (then the scan)
            step = replace(step, admit=())
        said: list[dict[str, Any]] = []
        admitted = [a for i in step.admit if (a := await self._admit(conn, children[i], owner, done))]
        for i in step.skip:
            said.append(await self._skip(conn, children[i], b))
        if admitted:
            # The scan looks at the turn soon: a command this process fails to send goes again.
            await conn.execute(
                "UPDATE turns SET wake_at = now() WHERE id = $1 AND status = 'waiting'", b["turn_id"]
            )
        ended = None
        if step.outcome is not None:
            ended = step.outcome
            full = await self._children(conn, b, _REPORT_COLUMNS)
            said.append(await self._settle(conn, b, full, step.outcome, wake_channel))
            done.settled.append(batch_id)
        if not (admitted or step.skip or ended):
            return
        counts = _counts(c["status"] for c in children)
        said.insert(0, facts.batch_progress(batch_id, b["call_id"], counts, admitted=admitted,
                                            skipped=len(step.skip), ended=ended))  # fmt: skip
        await self.store.journal.append(
            conn, turn["session_id"], b["turn_id"], said, thread_id=turn["thread_id"],
            status=await self.store.turns.status_of(conn, b["turn_id"]), phase=turn["phase"],
        )  # fmt: skip

    async def _children(self, conn: Connection, b: Any, columns: str) -> list[dict[str, Any]]:
        """The batch's children by index, as they stand in this transaction."""
        rows = await conn.fetch(
            f"SELECT {columns} FROM executions WHERE turn_id = $1 AND tool_step = $2",
            b["turn_id"],
            b["tool_step"],
        )
        found: dict[int, dict[str, Any]] = {}
        for r in rows:
            parent = parent_of(r["id"])
            if parent is not None and parent[0] == b["id"]:
                found[parent[1]] = {**dict(r), "index": parent[1]}
        return [found[i] for i in sorted(found)]

    async def _admit(self, conn: Connection, child: dict[str, Any], owner: str, done: Admitted) -> str | None:
        row = await conn.fetchrow(
            f"""UPDATE executions SET {_ADMITTED.set}, how = NULL, created_by = $2, updated_at = now()
                 WHERE id = $1 AND {_ADMITTED.guard} RETURNING route, command, command_message_id""",
            child["id"],
            owner,
        )
        if row is None or row["command"] is None:
            return None
        child["status"] = str(ExecutionStatus.INTENDED)
        done.commands.append((row["route"], bytes(row["command"]), row["command_message_id"]))
        return str(child["id"])

    async def _skip(self, conn: Connection, child: dict[str, Any], b: Any) -> dict[str, Any]:
        """A child fail-fast will never run: CANCELLED, never sent."""
        error = {"code": "not_run", "message": "the batch stopped admitting calls after a failure"}
        await conn.execute(
            f"""UPDATE executions SET {_SKIPPED.set}, how = 'not_run', error = $2, command = NULL,
                       updated_at = now() WHERE id = $1 AND {_SKIPPED.guard}""",
            child["id"],
            error,
        )
        child.update(status=str(ExecutionStatus.CANCELLED), how="not_run", error=error)
        return facts.execution_event("cancelled", child["id"], child["call_id"], child["tool"], how="not_run")

    async def _settle(
        self, conn: Connection, b: Any, children: list[dict[str, Any]], outcome: str, wake_channel: str
    ) -> dict[str, Any]:
        """The batch call ends with its report (FAILED in fail-fast mode after a failure, naming
        it), and its turn goes on if that settled its step."""
        error = None
        stopped = None
        if outcome == "failed":
            first = first_failure(children)
            what = f"call {first['index']} ({first['id']}) {first['status']}" if first else "a call failed"
            stopped = f"{what}; the calls after it were not run"
            error = {"code": "batch_failed", "message": stopped}
        result = report(b["size"], b["mode"], b["on_failure"], children, stopped)
        await self.store.controls.settle_by_hand(
            conn, {"id": b["id"], "turn_id": b["turn_id"], "tool_step": b["tool_step"]}, status=outcome,
            how="batch", result=Json(result), error=error, evidence=f"{len(children)} calls settled",
            wake_channel=wake_channel,
        )  # fmt: skip
        await conn.execute("UPDATE batches SET open = false WHERE id = $1", b["id"])
        return facts.execution_event(outcome, b["id"], b["call_id"], NAME, how="batch")


def _counts(statuses: Iterable[str]) -> dict[str, int]:
    counts = {"done": 0, "failed": 0, "in_flight": 0, "waiting": 0}
    for s in statuses:
        if s in FAILED:
            counts["failed"] += 1
        elif s in FINAL:
            counts["done"] += 1
        elif s in IN_FLIGHT:
            counts["in_flight"] += 1
        else:
            counts["waiting"] += 1
    return counts
