"""What a sandbox needs besides its calls, kept as rows so that any worker does it (a replaced
host abandons nothing): a deletion, and keep-alive.

``request-deletion`` commits the intent (DELETING, due now): from then on the binding takes no
new command. The chore scan of every worker of the pool picks up due rows whose lease is free
(never renewed by a dead or frozen worker); for a deletion it waits while any execution using
the binding is still open in the ledger, then deletes the container and its volume (or the
directory), idempotently, and commits DELETED; a failed deletion is tried again, at most
``PROVIDER_ATTEMPTS`` times, then left DELETING with its error until requested again. A READY
binding's keep-alive (start its container again if the engine stopped it) is due every
``keepalive_seconds``; a CREATING one whose creator died is finished when the provider shows it.

``reconcile-creation`` resolves an UNKNOWN creation with evidence: ``created`` (the sandbox under
the identity is this binding's) or ``absent`` (nothing is there). It checks the evidence against
the provider where the provider answers, and never creates, deletes or writes anything there.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

from hands.sandbox.backends.base import ProviderError
from hands.sandbox.lifecycle import PROVIDER_ATTEMPTS, Lifecycle
from hands.sandbox.rules.binding import Found, judge
from hands.sandbox.rules.states import SandboxStatus
from hands.sandbox.store import SandboxRow, SandboxRows
from infra.process.logging import get_logger
from infra.process.loops import BackgroundLoop
from protocol import ConflictError, NotFoundError, SchemaError

log = get_logger(__name__)
S = SandboxStatus


async def request_deletion(rows: SandboxRows, namespace: str, binding: str) -> SandboxRow:
    """Commit the intent to delete a binding's sandbox; the scan carries it out."""

    async def ask(conn: Any) -> SandboxRow:
        row = await rows.get(conn, namespace, binding, for_update=True)
        if row is None:
            raise NotFoundError(f"sandbox {binding} is not in namespace {namespace}")
        if row.status is S.DELETED:
            return row
        moved = await rows.move(conn, row, S.DELETING, due_in=0.0, attempts=0, error=None)
        if moved is None:
            raise ConflictError(f"sandbox {binding} changed meanwhile; ask again")
        return moved

    return await rows.transact(ask)


async def reconcile_creation(
    life: Lifecycle,
    namespace: str,
    binding: str,
    outcome: Literal["created", "absent"],
    *,
    evidence: str,
    actor: str,
) -> SandboxRow:
    """Resolve an UNKNOWN creation with ``evidence``; refused where the provider says otherwise."""
    if not evidence.strip():
        raise SchemaError("a reconcile needs evidence: say how you know")
    rows = life.rows
    row = await rows.read(lambda conn: rows.get(conn, namespace, binding))
    if row is None:
        raise NotFoundError(f"sandbox {binding} is not in namespace {namespace}")
    if row.status is not S.UNKNOWN:
        raise ConflictError(
            f"sandbox {binding} is {row.status.value.upper()}, not UNKNOWN: nothing to reconcile"
        )
    try:
        verdict: Found | None = judge(await life.backend.find(row.identity), life.expected(row))
    except ProviderError:
        verdict = None  # cannot be asked: the evidence is all there is
    if outcome == "created" and verdict not in (None, Found.OURS):
        raise ConflictError(
            f"the provider shows {verdict.value if verdict else ''} under {row.identity}, "
            "not this binding's sandbox"
        )
    if outcome == "absent" and verdict not in (None, Found.NOTHING):
        raise ConflictError(f"the provider holds something under {row.identity}: it is not absent")
    new = S.READY if outcome == "created" else S.FAILED
    due = life.keepalive_seconds if new is S.READY else None
    done = await rows.transact(
        lambda conn: rows.move(conn, row, new, reconcile=True, due_in=due, evidence=evidence, actor=actor)
    )
    if done is None:
        raise ConflictError(f"sandbox {binding} changed meanwhile; look again")
    log.info("sandbox_reconciled", binding=binding, outcome=outcome, actor=actor)
    return done


class Chores:
    """The chore scan of one worker: every ``interval`` seconds, the due rows."""

    def __init__(self, life: Lifecycle, interval: float) -> None:
        self.life = life
        self._loop = BackgroundLoop("sandbox-chores", self.once, period=interval)

    async def run(self) -> None:
        await self._loop.run()

    async def once(self) -> int:
        life, rows = self.life, self.life.rows
        due = await rows.read(lambda conn: rows.due(conn, life.worker_id, 8))
        done = 0
        for row in due:
            leased = await rows.transact(
                partial(rows.take_lease, row=row, me=life.worker_id, seconds=life.lease_seconds)
            )
            if leased is None:
                continue
            try:
                await self._chore(leased)
            except Exception as exc:  # noqa: BLE001 - said, and the row looks again later
                log.warning("sandbox_chore_failed", binding=row.binding_id, error=repr(exc))
                await rows.transact(
                    partial(rows.postpone, row=leased, me=life.worker_id, due_in=life.interval)
                )
            done += 1
        return done

    async def _chore(self, row: SandboxRow) -> None:
        life, rows, me = self.life, self.life.rows, self.life.worker_id
        if row.status is S.DELETING:
            await self._delete(row)
        elif row.status is S.READY:
            try:
                await life.backend.resume(row.identity)
                error = None
            except Exception as exc:  # noqa: BLE001 - kept on the row, seen by `hands sandbox list`
                error = f"keep-alive: {exc}"

            async def kept(conn: Any) -> None:
                await rows.forget_settled_uses(conn, row)
                await rows.postpone(conn, row, me, life.keepalive_seconds, error=error)

            await rows.transact(kept)
        elif row.status is S.CREATING:
            found = judge(await life.backend.find(row.identity), life.expected(row))
            if found is Found.NOTHING:  # the call that wanted it makes it when it comes again
                await rows.transact(lambda conn: rows.postpone(conn, row, me, None))
            else:
                await life.create(row)
        else:
            await rows.transact(lambda conn: rows.postpone(conn, row, me, None))

    async def _delete(self, row: SandboxRow) -> None:
        life, rows, me = self.life, self.life.rows, self.life.worker_id
        users = await rows.read(lambda conn: rows.open_users(conn, row))
        if users:
            log.debug("sandbox_deletion_waits", binding=row.binding_id, users=len(users))
            await rows.transact(lambda conn: rows.postpone(conn, row, me, life.interval))
            return
        try:
            await life.backend.delete(row.identity)
        except Exception as exc:  # noqa: BLE001 - tried again, a bounded number of times
            attempts = row.attempts + 1
            again = life.interval * 2 ** min(attempts, 6) if attempts < PROVIDER_ATTEMPTS else None
            error = f"deletion failed {attempts} times: {exc}"
            await rows.transact(
                lambda conn: rows.postpone(conn, row, me, again, attempts=attempts, error=error)
            )
            return
        life.kill.hit("hands.sandbox_after_delete", row.binding_id)

        async def deleted(conn: Any) -> None:
            if await rows.move(conn, row, S.DELETED, me=me, due_in=None) is not None:
                await rows.forget_uses(conn, row)

        await rows.transact(deleted)
        log.info("sandbox_deleted", binding=row.binding_id, identity=row.identity)
