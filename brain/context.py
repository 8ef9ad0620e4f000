"""What the parts of one Brain process share: its store, codec, broker topology, caches, relays,
committers and knobs. Made once by ``brain.app``; nothing here is global."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from brain.agents import FrozenThreads
from brain.history import HistoryCache
from brain.models import Models
from brain.previews import Previews
from brain.relay import CommandRelay, ControlRelay
from brain.store import BrainStore, Move, Moved
from infra.groupcommit import GroupCommit
from infra.killpoints import KillPoints
from infra.payloads import PayloadCodec
from infra.transport import Topology


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
    moves: GroupCommit[Move, Moved] = field(init=False)
    models: Models = field(default_factory=Models)  # the model adapters, made once per spec
    previews: Previews = field(default_factory=Previews)  # streamed pieces of replies in progress

    def __post_init__(self) -> None:
        self.threads = FrozenThreads(self.store)
        self.history = HistoryCache(self.store)
        self.moves = GroupCommit(
            self.store.transact,
            self._commit_moves,
            name="moves",
            order=lambda m: m.before.id,
            single=lambda moves: True,  # commit_moves: one statement (the refusals are reads)
        )

    async def _commit_moves(self, conn: Any, moves: list[Move]) -> list[Moved | Exception]:
        """The runs' moves that are ready together, in one transaction; a refused one is told why."""
        done = await self.store.commit_moves(conn, moves, self.lease_seconds)
        results: list[Moved | Exception] = []
        for move, moved in zip(moves, done, strict=True):
            if moved is not None:
                results.append(moved)
                continue
            try:
                await self.store.refuse(conn, move)
            except Exception as exc:  # noqa: BLE001 - StaleOwnerError or IllegalTransitionError
                results.append(exc)
        return results
