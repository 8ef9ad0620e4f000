"""Opening a binding's sandbox for a call: creating it once, resuming it, refusing it.

A call names a binding (or its session's own); :meth:`Lifecycle.open` commits, in one transaction,
the binding's row (its identity and nonce, when it is new: *before* the provider is asked) and
the call's use of it (a deletion waits for every use that is still open in the ledger), refusing a
binding that is being deleted or whose creation is UNKNOWN. A creation is done under the row's
lease: look under the identity first (a creation whose reply was lost is found there and finished,
never made twice; something without this binding's labels makes it UNKNOWN), then create. A
resume checks the physical sandbox and the workspace marker its creation wrote, and says clearly
when either is missing or another's: nothing is re-created behind the agent's back.

Kill points (``TENDON_KILL_AT``, tag = the binding id): ``hands.sandbox_after_create`` (the
provider made the sandbox, nothing of it is committed), ``hands.sandbox_after_delete``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from hands.sandbox.backends.base import AlreadyExistsError, ProviderError, SandboxBackend
from hands.sandbox.rules.binding import (
    MARKER,
    Definition,
    Found,
    binding_id,
    identity,
    judge,
    labels,
    marker_problem,
    may_use,
)
from hands.sandbox.rules.errors import SandboxDeletingError, SandboxGoneError, SandboxUnknownError
from hands.sandbox.rules.states import STARTS, SandboxStatus
from hands.sandbox.store import SandboxRow, SandboxRows, rows_for
from infra.process.killpoints import KillPoints
from infra.process.logging import get_logger
from protocol import TendonError

log = get_logger(__name__)
S = SandboxStatus
PROVIDER_ATTEMPTS = 5  # provider calls for one creation or deletion before it ends visibly


@dataclass(frozen=True)
class Sandbox:
    """A binding's sandbox, checked and running: what a tool works in."""

    row: SandboxRow
    backend: SandboxBackend

    @property
    def identity(self) -> str:
        return self.row.identity

    async def shell(self, script: str) -> bytes:
        code, out = await self.backend.shell(self.identity, script)
        if code != 0:
            raise ProviderError(f"a shell step in sandbox {self.row.binding_id} exited {code}")
        return out

    async def write(self, path: str, data: bytes) -> None:
        await self.backend.write_file(self.identity, path, data)

    async def read(self, path: str, offset: int = 0, limit: int = -1) -> bytes | None:
        return await self.backend.read_file(self.identity, path, offset, limit)


def refusal(row: SandboxRow) -> TendonError:
    """Why a binding takes no new call in its status."""
    name = f"sandbox {row.binding_id}"
    if row.status is S.UNKNOWN:
        return SandboxUnknownError(
            f"{name}: its creation could not be confirmed ({row.error}); it waits for "
            "`hands sandbox reconcile-creation` with evidence"
        )
    if row.status is S.FAILED:
        return SandboxGoneError(f"{name}: its creation failed ({row.error}); request its deletion")
    return SandboxDeletingError(f"{name} is being deleted: it takes no new command")


class Lifecycle:
    """The sandboxes of one pool: made by ``backend`` from ``definition``, their rows in the
    ledger's pool (:meth:`attach`, once the pool is open)."""

    def __init__(
        self,
        backend: SandboxBackend,
        definition: Definition,
        *,
        kill: KillPoints | None = None,
        lease_seconds: float = 30.0,
        keepalive_seconds: float = 300.0,
        interval: float = 1.0,
    ) -> None:
        self.backend = backend
        self.definition = definition
        self.kill = kill or KillPoints()
        self.lease_seconds = lease_seconds
        self.keepalive_seconds = keepalive_seconds
        self.interval = interval
        self._rows: SandboxRows | None = None
        self.worker_id = ""

    def attach(self, pool: Any, worker_id: str) -> None:
        self._rows = rows_for(pool)
        self.worker_id = worker_id

    @property
    def rows(self) -> SandboxRows:
        assert self._rows is not None, "the sandbox lifecycle is not attached to a ledger yet"
        return self._rows

    def expected(self, row: SandboxRow) -> dict[str, str]:
        return labels(row.namespace, row.binding_id, row.nonce, row.identity)

    # ---- a call's sandbox ----------------------------------------------------------------

    async def open(self, namespace: str, session_id: str, sandbox: str | None, execution_id: str) -> Sandbox:
        """The sandbox of the binding a call names, checked and running; its use recorded."""
        bid = binding_id(session_id, sandbox)
        rows = self.rows

        async def claim(conn: Any) -> SandboxRow:
            row = await rows.get(conn, namespace, bid, for_update=True)
            if row is None or row.status is S.DELETED:
                new = self._new(namespace, bid, session_id, row)
                # None: another worker made it meanwhile; its row is the one (locked now).
                row = await rows.begin(conn, new, row, self.lease_seconds) or await rows.get(
                    conn, namespace, bid, for_update=True
                )
                assert row is not None
            may_use(bid, row.owner_session, session_id)
            # An execution that used it already goes on (a re-attach during a deletion).
            if row.status not in STARTS and not await rows.uses(conn, row, execution_id):
                raise refusal(row)
            await rows.add_use(conn, row, execution_id)
            return row

        row = await rows.transact(claim)
        if row.status is S.CREATING:
            row = await self._created(row)
        return await self.resume(row)

    def _new(self, namespace: str, bid: str, session_id: str, old: SandboxRow | None) -> dict[str, Any]:
        generation = old.generation + 1 if old is not None else 1
        d = self.definition
        return {
            "namespace": namespace,
            "binding_id": bid,
            "owner_session": session_id,
            "definition": d.name,
            "definition_version": d.version,
            "config_ref": json.dumps(d.config, sort_keys=True),
            "identity": identity(namespace, bid, generation),
            "nonce": uuid.uuid4().hex,
            "generation": generation,
            "lease_owner": self.worker_id,
        }

    async def resume(self, row: SandboxRow) -> Sandbox:
        """The physical sandbox of a READY (or deleting) binding, running, its marker checked."""
        where = f"sandbox {row.binding_id} ({self.backend.kind} {row.identity})"
        found = await self.backend.find(row.identity)
        problem = None
        if found is None:
            problem = "it is gone"
        elif judge(found, self.expected(row)) is not Found.OURS:
            problem = "what holds its name is not this binding's (other labels)"
        else:
            await self.backend.resume(row.identity)
            raw = await self.backend.read_file(row.identity, MARKER)
            problem = marker_problem(_json(raw), self.expected(row))
        if problem is not None:
            raise SandboxGoneError(
                f"{where}: {problem}; it is not re-created behind the agent's back: "
                f"`hands sandbox request-deletion {row.namespace} {row.binding_id}` ends this binding, "
                "and the next call makes a new one"
            )
        return Sandbox(row, self.backend)

    # ---- creation ------------------------------------------------------------------------

    async def _created(self, row: SandboxRow) -> SandboxRow:
        """Finish the creation of a CREATING binding (or wait for the worker doing it)."""
        deadline = time.monotonic() + 2 * self.lease_seconds + 10
        while True:
            leased = await self.rows.transact(
                lambda conn: self.rows.take_lease(conn, row, self.worker_id, self.lease_seconds)
            )
            if leased is not None:
                return await self.create(leased)
            # Another live worker creates it right now: its outcome is the row's.
            await asyncio.sleep(0.2)
            current = await self.rows.read(lambda conn: self.rows.get(conn, row.namespace, row.binding_id))
            assert current is not None
            if current.status is not S.CREATING:
                if current.status is S.READY:
                    return current
                raise refusal(current)
            if time.monotonic() > deadline:
                raise SandboxUnknownError(
                    f"sandbox {row.binding_id} is still being created by another worker"
                )

    async def create(self, row: SandboxRow) -> SandboxRow:
        """Under ``row``'s lease: look under the identity, create only where nothing is, finish
        what a lost reply left (the marker), and commit READY; or UNKNOWN, said."""
        me, expected = self.worker_id, self.expected(row)
        try:
            verdict = judge(await self.backend.find(row.identity), expected)
            if verdict is Found.NOTHING:
                try:
                    await self.backend.create(row.identity, expected)
                    self.kill.hit("hands.sandbox_after_create", row.binding_id)
                    verdict = Found.OURS
                except AlreadyExistsError:  # made meanwhile: judge what is there
                    verdict = judge(await self.backend.find(row.identity), expected)
            if verdict is Found.OURS and await self.backend.read_file(row.identity, MARKER) is None:
                await self.backend.resume(row.identity)
                await self.backend.write_file(row.identity, MARKER, json.dumps(expected).encode())
        except ProviderError as exc:
            return await self._provider_failed(row, exc)
        if verdict is Found.FOREIGN:
            why = f"the provider holds something under {row.identity} without this binding's labels"
            await self.rows.transact(lambda conn: self.rows.move(conn, row, S.UNKNOWN, me=me, error=why))
            raise SandboxUnknownError(f"sandbox {row.binding_id}: {why}; reconcile or delete it")
        done = await self.rows.transact(
            lambda conn: self.rows.move(conn, row, S.READY, me=me, due_in=self.keepalive_seconds, attempts=0)
        )
        if done is None:
            raise SandboxUnknownError(f"sandbox {row.binding_id}: its row moved while it was being created")
        log.info("sandbox_created", binding=row.binding_id, identity=row.identity)
        return done

    async def _provider_failed(self, row: SandboxRow, exc: ProviderError) -> SandboxRow:
        """A provider that could not be asked: tried again later, UNKNOWN after the budget."""
        attempts = row.attempts + 1
        if attempts >= PROVIDER_ATTEMPTS:
            why = f"the provider could not be asked {attempts} times: {exc.message}"
            await self.rows.transact(
                lambda conn: self.rows.move(
                    conn, row, S.UNKNOWN, me=self.worker_id, error=why, attempts=attempts
                )
            )
            raise SandboxUnknownError(f"sandbox {row.binding_id}: {why}") from exc
        await self.rows.transact(
            lambda conn: self.rows.postpone(
                conn, row, self.worker_id, self.interval, attempts=attempts, error=exc.message
            )
        )
        raise exc


def _json(raw: bytes | None) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")
