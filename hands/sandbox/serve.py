"""A pool's sandboxes, as the pool composes them: the backend ``--sandbox`` names, the tools,
and the chore scan, started once the ledger is open."""

from __future__ import annotations

from typing import Any

from hands.sandbox.backends import SandboxBackend, backend_for
from hands.sandbox.chores import Chores
from hands.sandbox.lifecycle import Lifecycle
from hands.sandbox.rules.binding import Definition
from hands.sandbox.tools import sandbox_tools
from hands.tools.declare import Tool
from infra.objects.payloads import ObjectStore
from infra.process.killpoints import KillPoints
from infra.process.settings import Settings


def lifecycle_for(settings: Settings, spec: str, kill: KillPoints | None = None) -> Lifecycle:
    """The lifecycle of the sandboxes ``spec`` (``local:DIR`` or ``docker``) makes."""
    backend: SandboxBackend = backend_for(
        spec, image=settings.sandbox_image, network=settings.sandbox_network
    )
    return Lifecycle(
        backend,
        Definition("default", backend.config()),
        kill=kill,
        lease_seconds=settings.lease_seconds,
        keepalive_seconds=settings.sandbox_keepalive_seconds,
        interval=max(settings.scan_interval, 0.5),
    )


class SandboxServing:
    """The sandbox tools of one route, their lifecycle and its chores."""

    def __init__(self, settings: Settings, route: str, spec: str, kill: KillPoints | None = None) -> None:
        self.life = lifecycle_for(settings, spec, kill)
        self._store: ObjectStore | None = None
        self.tools: list[Tool] = sandbox_tools(route, self.life, lambda: self._store)
        self.chores = Chores(self.life, self.life.interval)

    def attach(self, pool: Any, worker_id: str, store: ObjectStore | None) -> None:
        self.life.attach(pool, worker_id)
        self._store = store

    async def run(self) -> None:
        await self.chores.run()
