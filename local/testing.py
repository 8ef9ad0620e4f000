"""Tendon in a user's tests: the whole system in the test's own process, on the embedded backend
(SQLite, a local queue and a directory object store in a temporary directory), with the HTTP API
the `brain` verbs and ``brain.Client`` speak to. A test starts it with the tools it needs, submits
an agent's turn, waits for it and looks at what happened, as Temporal's test environment lets a
test run a workflow with its activities::

    from local.testing import local_tendon

    @pytest.fixture
    async def tendon(tmp_path):
        async with local_tendon(tmp_path, "examples.hello_tools") as t:
            yield t

    async def test_the_hello_agent_greets(tendon):
        turn = await tendon.run("examples/hello_agent.json", "Say hello")
        assert turn["status"] == "completed"

Nothing else is needed: no PostgreSQL, RabbitMQ or S3. Edited agent files are taken under their
name, as ``brain serve --local`` takes them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brain.face.client import AsyncClient
from brain.rules.agents import AgentDefinition
from hands.tools.registry import declared_routes
from infra.process.killpoints import KillPoints
from infra.process.settings import Settings
from local.embedded import DataDir, LocalSystem, run_local
from protocol import SchemaError, new_id

Agent = AgentDefinition | Mapping[str, Any] | str | Path


def agent_of(agent: Agent) -> AgentDefinition:
    """A definition from itself, its JSON as a mapping, or the path of its JSON file."""
    if isinstance(agent, AgentDefinition):
        return agent
    if isinstance(agent, str | Path):
        return AgentDefinition.from_file(agent)
    return AgentDefinition.model_validate(dict(agent))


@dataclass
class LocalTendon:
    """A running embedded Tendon: its HTTP API (``url``, ``client``) and its stores (``system``)."""

    system: LocalSystem
    url: str
    client: AsyncClient

    async def submit(
        self,
        agent: Agent,
        text: str,
        *,
        session: str = "test",
        request_id: str | None = None,
        thread: str = "main",
        expect_tools: bool = False,
    ) -> str:
        """Submit a turn (a new request id unless given); its turn id once it is durable.
        ``expect_tools``: take tools none of its pools serves (a turn that waits for them)."""
        found = await self.client.submitted(
            session, request_id or new_id(), text, agent_of(agent), thread=thread, expect_tools=expect_tools
        )
        return str(found["turn_id"])

    async def wait(self, turn_id: str, within: float = 30.0) -> dict[str, Any]:
        """The turn once it ended, as `brain show --json` gives it; TimeoutError if it did not
        within ``within`` seconds (a wait never cancels the turn)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            turn = await self.client.turn(turn_id, wait=min(10.0, max(0.0, deadline - loop.time())))
            if turn["status"] in ("completed", "failed", "cancelled"):
                return turn
            if loop.time() >= deadline:
                raise TimeoutError(f"turn {turn_id} is still {turn['status']} after {within:g} s")

    async def run(self, agent: Agent, text: str, *, within: float = 30.0, **where: Any) -> dict[str, Any]:
        """Submit a turn and wait for its end: the turn, with its executions and conversation."""
        return await self.wait(await self.submit(agent, text, **where), within)


@asynccontextmanager
async def local_tendon(
    data_dir: str | Path, *tools: str, settings: Settings | None = None
) -> AsyncIterator[LocalTendon]:
    """Run a Brain, a Hands pool per route of the ``tools`` modules (or ``.py`` files) and the
    HTTP API (on a free loopback port) on ``data_dir`` until the block ends."""
    pools = [(route, spec) for spec in tools for route in declared_routes(spec)]
    if len({route for route, _ in pools}) != len(pools):
        raise SchemaError("two tools modules declare tools for the same route: give one module per route")
    # Short scans: a test sees a wake-up or a recovery within a fraction of a second.
    base = settings or Settings(scan_interval=0.2, reconnect_grace=0.5)
    chosen = base.model_copy(update={"http": "127.0.0.1:0"})
    data = DataDir(Path(data_dir) / "tendon")
    async with run_local(chosen, data, pools=pools, killpoints=KillPoints(), follows_edits=True) as system:
        started = asyncio.ensure_future(system.ready.wait())
        await asyncio.wait([started, system.brain_task], return_when=asyncio.FIRST_COMPLETED)
        started.cancel()
        if system.http is None:
            raise RuntimeError(f"the Brain did not start: {system.brain_task.result()}")
        url = f"http://{system.http}"
        async with AsyncClient(url) as client:
            yield LocalTendon(system, url, client)
