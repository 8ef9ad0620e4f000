"""What the parts of one Brain process share: its store, codec, broker topology, caches, relays,
committers and knobs. Made once by ``brain.app``; nothing here is global."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial

from brain.models import Models
from brain.rules.delegation import REQUEST_PREFIX
from brain.rules.states import TERMINAL_TURN
from brain.run.endings import Endings
from brain.run.history import HistoryCache
from brain.run.metrics import BrainMetrics
from brain.run.previews import Previews
from brain.run.relay import CommandRelay, ControlRelay
from brain.run.threads import FrozenThreads
from brain.store import BrainStore, Move, Moved, Settled, TurnRow
from infra.db import Connection
from infra.db.groupcommit import GroupCommit
from infra.objects.payloads import PayloadCodec
from infra.process.killpoints import KillPoints
from infra.process.tracing import Tracing
from infra.transport import Topology
from protocol import SchemaError


@dataclass
class BrainContext:
    store: BrainStore
    codec: PayloadCodec
    topology: Topology
    killpoints: KillPoints
    commands: CommandRelay
    controls: ControlRelay
    owner: str  # this process's worker id: the owner of its leases
    wake_channel: str
    lease_seconds: float
    binding_wait_seconds: float
    # When the repair scan first looks at a turn that waits for its tools (a command whose Brain
    # died between its commit and its publish is sent again then).
    first_look: float
    threads: FrozenThreads = field(init=False)
    history: HistoryCache = field(init=False)
    # Turns whose runs are in progress in this process: the liveness keeper renews their leases,
    # so a phase longer than a lease (a slow model call) is not taken over while this Brain lives.
    active: set[str] = field(default_factory=set)
    # Turns whose run here began a model call that has not committed its reply: a run that ends
    # on a fault then supersedes that attempt (its previews may have been shown).
    asked: set[str] = field(default_factory=set)
    # Set when this Brain stops: a run returns after its next commit, holding the turn's lease
    # until the retirement hands it back (no phase is cut in the middle unless the drain runs out).
    draining: bool = False
    moves: GroupCommit[Move, Moved] = field(init=False)
    models: Models = field(default_factory=Models)  # the model adapters, made once per spec
    previews: Previews = field(default_factory=Previews)  # streamed pieces of replies in progress
    endings: Endings = field(default_factory=Endings)  # the API's waiters for turns to end
    metrics: BrainMetrics = field(default_factory=BrainMetrics)
    tracing: Tracing = field(default_factory=lambda: Tracing(None))
    # Set when a delegated call was committed or a child turn ended here: the delegation loop looks
    # at once instead of at its next period (``brain.run.delegation``).
    delegations: asyncio.Event = field(default_factory=asyncio.Event)
    # Runs the turns of framework agents (kind python): ``brain.frameworks.run_foreign``, given by
    # the composition root (that room sits above this one).
    foreign: Callable[..., Awaitable[TurnRow]] = field(default=lambda *_: _no_frameworks())
    agent_modules: tuple[str, ...] = ()  # where framework agents may be imported from (empty: anywhere)

    def __post_init__(self) -> None:
        self.threads = FrozenThreads(self.store)
        self.history = HistoryCache(self.store)
        self.moves = GroupCommit(
            partial(self.store.transact, held=self.store.held()),
            self._commit_moves,
            name="moves",
            order=lambda m: m.before.id,
            # commit_moves: one statement (the refusals are reads), and one more to freeze the
            # manifests of batch calls (brain.store.batches), which then need a transaction
            single=lambda moves: not any(i.batch for m in moves for i in m.intents),
        )

    async def move(self, move: Move) -> Moved:
        """Commit a run's move (in a transaction shared with the moves ready together); one that
        ends its turn is measured and traced."""
        moved = await self.moves.submit(move)
        after = moved.row
        if after.status in TERMINAL_TURN and move.before.status not in TERMINAL_TURN:
            self.ended(after.id, str(after.status), after.created_at)
            if after.request_id.startswith(REQUEST_PREFIX):
                self.delegations.set()
        return moved

    def ended(self, turn_id: str, status: str, created_at: datetime | None) -> None:
        """A turn ended here (committed): its latency, its span (recorded once it is whole), and
        whoever waits for it through this Brain's API."""
        self.endings.ended(turn_id)
        self.metrics.turn_ended(status, created_at)
        self.tracing.turn_ended(turn_id, status, created_at)

    def failed(self, settled: Settled) -> None:
        """A turn failed from outside a move (its run's error, a claim at its limit, a route that
        never answers): the cancels of its open executions go out, and it ended here."""
        self.controls.send(settled.controls)
        self.ended(settled.turn_id, "failed", settled.created_at)

    async def _commit_moves(self, conn: Connection, moves: list[Move]) -> list[Moved | Exception]:
        """The runs' moves that are ready together, in one transaction; a refused one is told why."""
        done = await self.store.turns.commit_moves(conn, moves, self.lease_seconds)
        results: list[Moved | Exception] = []
        for move, moved in zip(moves, done, strict=True):
            if moved is not None:
                await self.store.batches.freeze(conn, move.before.id, move.intents)
                results.append(moved)
                continue
            try:
                await self.store.turns.refuse(conn, move)
            except Exception as exc:  # noqa: BLE001 - StaleOwnerError or IllegalTransitionError
                results.append(exc)
        return results


async def _no_frameworks() -> TurnRow:
    """The runner of a context made without one (a test's): a framework's turn fails saying so."""
    raise SchemaError("this Brain runs no agents of a framework (its composition gave it no runner)")
