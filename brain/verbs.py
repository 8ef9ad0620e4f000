"""What users ask the Brain to do, over its store: one place for the CLI (and the HTTP API).

Each verb is idempotent where it takes a request id: the same request id with the same input
answers what the first call did, however many race; with other input it raises ConflictError.
"""

from __future__ import annotations

from brain.agents import AgentDefinition
from brain.store import BrainStore
from infra.db import unstorable
from infra.transport import Topology, Transport
from protocol import SchemaError


async def submit(
    store: BrainStore,
    *,
    namespace: str,
    session_id: str,
    request_id: str,
    user_input: str,
    agent: AgentDefinition,
    wake_channel: str,
) -> tuple[str, bool]:
    """Accept a turn durably (invariant 1); returns (turn id, created by this call).

    Racing submits of one request id all get the one turn: the one that lost the race to insert
    it is tried again, and then finds it. Text the database cannot store (a NUL) is bad input,
    said so before anything is written.
    """
    for what, value in (("the input", user_input), (f"agent {agent.name}", agent.model_dump(mode="json"))):
        problem = unstorable(value)
        if problem is not None:
            raise SchemaError(f"{what} cannot be stored: its text {problem}")
    return await store.submit(
        namespace=namespace,
        session_id=session_id,
        request_id=request_id,
        user_input=user_input,
        agent=agent,
        wake_channel=wake_channel,
    )


async def unserved_tools(
    store: BrainStore, transport: Transport, topology: Topology, tools: list[str]
) -> list[str]:
    """Why some of ``tools`` would not run now, one sentence each (none when all are served):
    never announced by any Hands pool, or announced for a route nobody consumes right now."""
    pairs = await store.bound_routes(tools)
    routes: dict[str, list[str]] = {}
    for name, route in pairs:
        routes.setdefault(route, []).append(name)
    problems = []
    missing = sorted(set(tools) - {name for name, _ in pairs})
    if missing:
        problems.append(f"no Hands pool has announced {', '.join(missing)}")
    for route, names in sorted(routes.items()):
        if await transport.consumers(topology.commands(route)) == 0:
            problems.append(f"no Hands pool serves route {route} ({', '.join(sorted(set(names)))}) right now")
    return problems
