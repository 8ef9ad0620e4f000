"""How a Hands worker writes its ledger: events packed, changes of many executions committed
together, and what they committed handed to the relay.

Accepts (new rows) and changes (a start, an outcome) from every task of the worker go through one
group committer: those ready together share a transaction and, on PostgreSQL, one statement that
commits on its own. A change is guarded by the row as its task last knew it; when the guard
refuses it (the row moved on: a cancel, a takeover), :meth:`LedgerWriter.save` looks at the row
under a lock instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from hands.store import Change, Execution, Ledger, NewExecution
from infra.db import Connection
from infra.db.groupcommit import GroupCommit
from infra.objects.payloads import PayloadCodec


@dataclass(frozen=True)
class _Insert:
    new: NewExecution


Op = _Insert | Change


class LedgerWriter:
    """Packs events and commits ledger changes for one worker; hands what committed to ``sent``."""

    def __init__(
        self, ledger: Ledger, codec: PayloadCodec, sent: Callable[[list[dict[str, Any]]], None]
    ) -> None:
        self.ledger = ledger
        self.codec = codec
        self.sent = sent
        self.committer: GroupCommit[Op, Execution | None] = GroupCommit(
            partial(ledger.transact, held=ledger.held()),
            self._apply,
            name="ledger",
            order=_key,
            single=lambda ops: True,  # Ledger.write: one statement, where statements commit alone
        )

    async def event(self, execution_id: str, header: dict[str, str], seq: int, body: Any) -> dict[str, Any]:
        """The packed envelope of ``body`` as event ``seq`` (a big body is uploaded here)."""
        return await self.codec.pack_event(execution_id, header, seq, body)

    async def events(
        self, execution_id: str, header: dict[str, str], first_seq: int, *bodies: Any
    ) -> list[dict[str, Any]]:
        return [await self.event(execution_id, header, first_seq + i, b) for i, b in enumerate(bodies)]

    async def _apply(self, conn: Connection, ops: list[Op]) -> list[Execution | None]:
        inserts = [i for i, op in enumerate(ops) if isinstance(op, _Insert)]
        changes = [i for i, op in enumerate(ops) if isinstance(op, Change)]
        inserted, changed = await self.ledger.write(
            conn,
            [op.new for op in ops if isinstance(op, _Insert)],
            [op for op in ops if isinstance(op, Change)],
        )
        results: list[Execution | None] = [None] * len(ops)
        for i, row in zip(inserts + changes, inserted + changed, strict=True):
            results[i] = row
        return results

    async def insert(self, new: NewExecution) -> Execution | None:
        """Insert a new row with its first events; None (nothing written) if its id is known."""
        row = await self.committer.submit(_Insert(new))
        if row is not None:
            self.sent(new.events)
        return row

    async def change(self, change: Change) -> Execution | None:
        """Apply a guarded change; None when the row is no longer as ``change.before`` says."""
        row = await self.committer.submit(change)
        if row is not None:
            self.sent(change.events)
        return row

    async def change_locked(
        self,
        execution_id: str,
        owner: str,
        build: Callable[[Execution], Awaitable[Change | None]],
        landed: Callable[[Execution], bool] | None = None,
    ) -> Execution | None:
        """The careful way: lock the row (fenced: ``owner`` must still own it), ask ``landed``
        whether an earlier attempt is in already (then nothing more), else apply what ``build``
        makes of the row as it is now (None: nothing to write)."""
        committed: list[dict[str, Any]] = []

        async def work(conn: Connection) -> Execution | None:
            committed.clear()
            row = await self.ledger.lock_owned(conn, execution_id, owner)
            if landed is not None and landed(row):
                return None
            change = await build(row)
            if change is None:
                return row
            (moved,) = await self.ledger.change(conn, [change])
            assert moved is not None, f"a change of locked execution {execution_id} was refused"
            committed.extend(change.events)
            return moved

        moved = await self.ledger.transact(work)
        if committed:
            self.sent(committed)
        return moved


def _key(op: Op) -> str:
    return op.new.execution_id if isinstance(op, _Insert) else op.before.execution_id
