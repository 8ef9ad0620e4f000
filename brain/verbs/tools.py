"""Which tools a submit may name (``brain.rules.admission`` decides), and which of them would not
run now: the submit refuses an agent naming a tool no Hands pool has ever announced, and warns
about one that is known but that nobody serves right now (its turn waits for a pool)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from brain.rules.admission import check_model, pool_tools, refusal, unknown_tools
from brain.rules.agents import AgentDefinition
from brain.store import BrainStore
from infra.transport import Topology, Transport

# How long a submit naming a tool no pool announced waits for an announcement on its way (a pool
# started a moment ago: its announcement reaches a Brain through the broker), looking this often.
ANNOUNCE_GRACE = 3.0
LOOK = 0.1
# How long a route seen served counts as served without asking the broker again.
SERVED_FRESH = 1.0


@dataclass
class KnownTools:
    """What a process knows of the announced tools, kept between submits: an announcement is never
    taken back, so a tool seen once is known for good, and a submit whose tools were all seen reads
    nothing (the submit is a Brain's hot path).

    ``served``: the tools of a server that runs its pools itself (``brain serve --local``): those
    are what a submit may name, known at once, announced or not."""

    served: Collection[str] | None = None
    grace: float = ANNOUNCE_GRACE
    routes: dict[str, frozenset[str]] = field(default_factory=dict)  # tool -> the routes announcing it
    served_at: dict[str, float] = field(default_factory=dict)  # route -> when it was last seen served

    async def admit(self, store: BrainStore, agent: AgentDefinition, *, expect: bool = False) -> None:
        """Refuse (SchemaError, UnknownToolError) a submit of ``agent`` whose model kind no Brain
        has, or that names a tool no pool announced, unless it is ``expect``-ed later (the
        submit's ``expect_tools``) or the agent lists it in its ``expect_tools``."""
        check_model(agent)
        if self.served is None and all(t in self.routes for t in pool_tools(agent)):
            return  # every tool seen before: what a Brain's API meets on nearly every submit
        if self.served is not None:
            unknown = unknown_tools(agent, self.served, expect=expect)
            if unknown:
                raise refusal(agent, unknown, self.served, served_here=True)
            return
        unknown = unknown_tools(agent, self.routes, expect=expect)
        deadline = time.monotonic() + self.grace
        while unknown:
            await self._read(store, unknown)
            unknown = unknown_tools(agent, self.routes, expect=expect)
            if not unknown:
                return
            if time.monotonic() >= deadline:
                known = {r["name"] for r in await store.read(store.bindings.routes)}
                raise refusal(agent, unknown, known, served_here=False)
            await asyncio.sleep(LOOK)

    async def unserved(
        self, store: BrainStore, transport: Transport, topology: Topology, agent: AgentDefinition
    ) -> list[str]:
        """Why some of the agent's tools would not run now, one sentence each (none when all are
        served): never announced (a tool expected later), or announced for a route nobody consumes
        right now. The broker is asked about a route at most once a second while it is served."""
        now = time.monotonic()
        routes = self.routes
        if self.served is None and all(
            t in routes and all(now - self.served_at.get(r, -SERVED_FRESH) < SERVED_FRESH for r in routes[t])
            for t in pool_tools(agent)
        ):
            return []  # every tool's routes seen served within the second: nothing to ask
        tools = [t for t in pool_tools(agent) if self.served is None or t not in self.served]
        await self._read(store, [t for t in tools if t not in self.routes])
        problems = []
        missing = sorted(t for t in tools if t not in self.routes)
        if missing:
            problems.append(
                f"no Hands pool has announced {', '.join(missing)}; the turn waits for one as long as the "
                "Brain's TENDON_BINDING_WAIT_SECONDS allow (start `hands serve --route ROUTE --tools MODULE`)"
            )
        by_route: dict[str, set[str]] = {}
        for t in tools:
            for route in self.routes.get(t, ()):
                by_route.setdefault(route, set()).add(t)
        for route, names in sorted(by_route.items()):
            if time.monotonic() - self.served_at.get(route, -SERVED_FRESH) < SERVED_FRESH:
                continue
            if await transport.consumers(topology.commands(route)) > 0:
                self.served_at[route] = time.monotonic()
                continue
            problems.append(
                f"no Hands pool serves route {route} ({', '.join(sorted(names))}) right now; its calls "
                f"wait for one (start `hands serve --route {route} --tools MODULE`)"
            )
        return problems

    async def _read(self, store: BrainStore, tools: Iterable[str]) -> None:
        wanted = list(tools)
        if wanted:
            for name, route in await store.bindings.bound_routes(wanted):
                self.routes[name] = self.routes.get(name, frozenset()) | {route}
