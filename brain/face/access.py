"""How the `brain` verbs reach a Brain: its database directly, or a Brain's HTTP API when given a
URL (``--url`` or ``TENDON_URL``, with ``TENDON_TOKEN``). Both answer with the same data (the API
returns what the verbs return), so each command prints the same either way."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

from brain import verbs
from brain.face.client import AsyncClient
from brain.rules.agents import AgentDefinition
from brain.rules.states import TERMINAL_TURN
from brain.store import BrainStore, open_store, wake_channel
from brain.verbs import browse, controls, signals
from brain.verbs.describe import describe
from brain.verbs.tools import KnownTools
from infra.process.settings import Settings
from infra.transport import Topology
from infra.transport.broker import Broker
from protocol import new_id

DIRECT_LOOK = 0.2  # seconds between looks at a turn's row when waiting without a Brain's API
UNSERVED_WITHIN = 10.0  # seconds a submit asks the broker which routes are served, at most


class Access(Protocol):
    async def submit(
        self,
        session: str,
        request_id: str,
        text: str,
        agent: AgentDefinition,
        thread: str,
        *,
        expect_tools: bool,
        metadata: dict[str, str] | None = None,
        thread_metadata: dict[str, str] | None = None,
        strategy: str = "enqueue",
    ) -> dict[str, Any]: ...
    async def describe(self, turn_id: str) -> dict[str, Any]: ...
    async def until_ended(self, turn_id: str, seconds: float) -> dict[str, Any]: ...
    async def history(self, turn_id: str) -> dict[str, Any]: ...
    async def output(self, execution_id: str, offset: int) -> dict[str, Any]: ...
    async def threads(self, session: str) -> list[dict[str, Any]]: ...
    async def turns(
        self, session: str, *, thread: str | None, status: str | None, limit: int, after: int
    ) -> list[dict[str, Any]]: ...
    async def close(self, session: str, thread: str | None) -> bool: ...
    async def control(
        self, turn_id: str, kind: str, request_id: str | None, **fields: Any
    ) -> dict[str, Any]: ...
    async def respond(self, turn_id: str, request_id: str | None, **fields: Any) -> dict[str, Any]: ...
    async def receipts(self, turn_id: str) -> list[dict[str, Any]]: ...
    async def signal(
        self, turn_id: str, request_id: str | None, key: str, payload: Any
    ) -> dict[str, Any]: ...


class Direct:
    """The verbs on the Brain's database, acting in ``TENDON_NAMESPACE``."""

    def __init__(self, store: BrainStore, settings: Settings) -> None:
        self.store, self.settings = store, settings
        self.namespace = settings.namespace

    async def submit(
        self,
        session: str,
        request_id: str,
        text: str,
        agent: AgentDefinition,
        thread: str,
        *,
        expect_tools: bool,
        metadata: dict[str, str] | None = None,
        thread_metadata: dict[str, str] | None = None,
        strategy: str = "enqueue",
    ) -> dict[str, Any]:
        """As the API answers it: the turn id, whether this call made it, and why some of the
        agent's tools would not run now (``warnings``, asked of the broker for a new turn)."""
        turn_id, created = await verbs.submit(
            self.store, namespace=self.namespace, session_id=session, request_id=request_id, user_input=text,
            agent=agent, wake_channel=wake_channel(self.settings), thread=thread, expect_tools=expect_tools,
            metadata=metadata, thread_metadata=thread_metadata,
            strategy=strategy, topology=Topology(self.settings.queue_prefix),
        )  # fmt: skip
        warnings = await self._unserved(agent) if created and agent.tools else []
        return {"turn_id": turn_id, "created": created, "warnings": warnings}

    async def _unserved(self, agent: AgentDefinition) -> list[str]:
        topology = Topology(self.settings.queue_prefix)

        async def ask() -> list[str]:
            async with Broker(self.settings.amqp_url, topology) as broker:
                return await KnownTools().unserved(self.store, broker, topology, agent)

        try:
            return await asyncio.wait_for(ask(), UNSERVED_WITHIN)
        except Exception as exc:  # noqa: BLE001 - only a warning: the turn is accepted already
            return [f"could not check which tools are served: {exc!r}"]

    async def describe(self, turn_id: str) -> dict[str, Any]:
        return await describe(self.store, self.namespace, turn_id)

    async def until_ended(self, turn_id: str, seconds: float) -> dict[str, Any]:
        """The turn once it ended or ``seconds`` passed. A turn's end wakes only the Brain that
        committed it, so from outside its row is looked at again, every ``DIRECT_LOOK`` (one
        read, as the API's wait does), and the whole description read once at the end."""
        store, loop = self.store, asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            row = await store.read(
                lambda conn: store.turns.lock_turn(conn, self.namespace, turn_id, lock=False)
            )
            left = deadline - loop.time()
            if row is None or row.status in TERMINAL_TURN or left <= 0:
                return await self.describe(turn_id)  # a turn that is not there: NotFoundError
            await asyncio.sleep(min(DIRECT_LOOK, left))

    async def history(self, turn_id: str) -> dict[str, Any]:
        return await verbs.history(self.store, namespace=self.namespace, turn_id=turn_id)

    async def output(self, execution_id: str, offset: int) -> dict[str, Any]:
        namespace = self.namespace
        return await browse.output(self.store, namespace=namespace, execution_id=execution_id, offset=offset)

    async def threads(self, session: str) -> list[dict[str, Any]]:
        return await verbs.threads(self.store, namespace=self.namespace, session_id=session)

    async def turns(
        self, session: str, *, thread: str | None, status: str | None, limit: int, after: int
    ) -> list[dict[str, Any]]:
        return await verbs.turns(
            self.store, namespace=self.namespace, session_id=session, thread=thread, status=status,
            limit=limit, after=after,
        )  # fmt: skip

    async def close(self, session: str, thread: str | None) -> bool:
        return await verbs.close(self.store, namespace=self.namespace, session_id=session, thread=thread)

    async def control(self, turn_id: str, kind: str, request_id: str | None, **fields: Any) -> dict[str, Any]:
        receipt = await controls.control(
            self.store, namespace=self.namespace, turn_id=turn_id, request_id=request_id or new_id(),
            kind=controls.Kind(kind), topology=Topology(self.settings.queue_prefix),
            wake_channel=wake_channel(self.settings), text=fields.get("text"),
            revision=fields.get("revision"), target=fields.get("control_id"),
        )  # fmt: skip
        return receipt.as_dict()

    async def respond(self, turn_id: str, request_id: str | None, **fields: Any) -> dict[str, Any]:
        receipt = await controls.respond(
            self.store, namespace=self.namespace, turn_id=turn_id, request_id=request_id or new_id(),
            wake_channel=wake_channel(self.settings), topology=Topology(self.settings.queue_prefix), **fields,
        )  # fmt: skip
        return receipt.as_dict()

    async def receipts(self, turn_id: str) -> list[dict[str, Any]]:
        found = await controls.receipts(self.store, namespace=self.namespace, turn_id=turn_id)
        return [r.as_dict() for r in found]

    async def signal(self, turn_id: str, request_id: str | None, key: str, payload: Any) -> dict[str, Any]:
        receipt = await signals.signal(
            self.store, namespace=self.namespace, turn_id=turn_id, request_id=request_id or new_id(),
            key=key, payload=payload, wake_channel=wake_channel(self.settings),
        )  # fmt: skip
        return receipt.as_dict()


class Remote:
    """The same over a Brain's HTTP API, acting in the token's namespace."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def submit(
        self,
        session: str,
        request_id: str,
        text: str,
        agent: AgentDefinition,
        thread: str,
        *,
        expect_tools: bool,
        metadata: dict[str, str] | None = None,
        thread_metadata: dict[str, str] | None = None,
        strategy: str = "enqueue",
    ) -> dict[str, Any]:
        return await self.client.submitted(
            session, request_id, text, agent, thread=thread, expect_tools=expect_tools, metadata=metadata,
            thread_metadata=thread_metadata, multitask_strategy=strategy,
        )  # fmt: skip

    async def describe(self, turn_id: str) -> dict[str, Any]:
        return await self.client.turn(turn_id)

    async def until_ended(self, turn_id: str, seconds: float) -> dict[str, Any]:
        """One request, answered when the turn ends (``GET /v1/turns/{id}?wait=``)."""
        return await self.client.turn(turn_id, wait=seconds)

    async def history(self, turn_id: str) -> dict[str, Any]:
        return await self.client.history(turn_id)

    async def output(self, execution_id: str, offset: int) -> dict[str, Any]:
        return await self.client.output(execution_id, offset=offset)

    async def threads(self, session: str) -> list[dict[str, Any]]:
        return await self.client.threads(session)

    async def turns(
        self, session: str, *, thread: str | None, status: str | None, limit: int, after: int
    ) -> list[dict[str, Any]]:
        return await self.client.turns(session, thread=thread, status=status, limit=limit, after=after)

    async def close(self, session: str, thread: str | None) -> bool:
        return await self.client.close_session(session, thread=thread)

    async def control(self, turn_id: str, kind: str, request_id: str | None, **fields: Any) -> dict[str, Any]:
        given = {k: v for k, v in fields.items() if v is not None}
        return await self.client.control(turn_id, kind, request_id=request_id, **given)

    async def respond(self, turn_id: str, request_id: str | None, **fields: Any) -> dict[str, Any]:
        given = {k: v for k, v in fields.items() if v is not None}
        return await self.client.respond(turn_id, request_id=request_id, **given)

    async def receipts(self, turn_id: str) -> list[dict[str, Any]]:
        return await self.client.receipts(turn_id)

    async def signal(self, turn_id: str, request_id: str | None, key: str, payload: Any) -> dict[str, Any]:
        return await self.client.signal(turn_id, key, payload, request_id=request_id)


@asynccontextmanager
async def access(settings: Settings, url: str | None = None) -> AsyncIterator[Access]:
    """The Brain at ``url`` (or ``TENDON_URL``) over HTTP, else its database."""
    url = url or settings.url
    if url:
        async with AsyncClient(url, settings.token or None) as client:
            yield Remote(client)
        return
    store = await open_store(settings)
    try:
        yield Direct(store, settings)
    finally:
        await store.close()
