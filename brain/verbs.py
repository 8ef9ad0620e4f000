"""What users ask the Brain to do, over its store: one place for the CLI (and the HTTP API).

Each verb is idempotent where it takes a request id: the same request id with the same input
answers what the first call did, however many race; with other input it raises ConflictError.
"""

from __future__ import annotations

from typing import Any

from brain.agents import AgentDefinition
from brain.store import events, turns
from infra.db import transact, unstorable
from infra.transport import Topology, Transport
from protocol import SchemaError


async def submit(
    pool: Any,
    *,
    namespace: str,
    session_id: str,
    request_id: str,
    user_input: str,
    agent: AgentDefinition,
    wake_channel: str,
) -> tuple[str, bool]:
    """Accept a turn durably (invariant 1); returns (turn id, created by this call).

    Racing submits of one request id all get the one turn: the transaction that lost the race
    to insert it is tried again, and then finds it. Text the database cannot store (a NUL) is
    bad input, said so before anything is written.
    """
    for what, value in (("the input", user_input), (f"agent {agent.name}", agent.model_dump(mode="json"))):
        problem = unstorable(value)
        if problem is not None:
            raise SchemaError(f"{what} cannot be stored: its text {problem}")

    async def commit(conn: Any) -> tuple[str, bool]:
        accepted = await turns.submit(
            conn,
            namespace=namespace,
            session_id=session_id,
            request_id=request_id,
            user_input=user_input,
            agent=agent,
        )
        await events.wake(conn, wake_channel)
        return accepted

    return await transact(pool, commit, read_then_insert=True)


async def unserved_tools(pool: Any, transport: Transport, topology: Topology, tools: list[str]) -> list[str]:
    """Why some of ``tools`` would not run now, one sentence each (none when all are served):
    never announced by any Hands pool, or announced for a route nobody consumes right now."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT DISTINCT name, route FROM bindings WHERE name = ANY($1::text[]) ORDER BY name", tools
        )
    routes: dict[str, list[str]] = {}
    for r in rows:
        routes.setdefault(r["route"], []).append(r["name"])
    problems = []
    missing = sorted(set(tools) - {r["name"] for r in rows})
    if missing:
        problems.append(f"no Hands pool has announced {', '.join(missing)}")
    for route, names in sorted(routes.items()):
        if await transport.consumers(topology.commands(route)) == 0:
            problems.append(f"no Hands pool serves route {route} ({', '.join(names)}) right now")
    return problems
