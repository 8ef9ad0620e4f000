"""Agent definitions and frozen threads as a Brain process keeps them: read once, not once per run."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from pydantic import ValidationError

from brain.rules.agents import AgentDefinition, invalid
from infra.db import Connection
from protocol import SchemaError


class FrozenThreads:
    """Agent definitions and frozen threads, read once per Brain process, not once per run.

    Neither changes once written: an agent version is immutable (a different definition under
    the same version is refused at submit), and a thread's bindings, once frozen, stay (but on a
    local development server, which moves a thread with nothing unfinished to an edited agent:
    :meth:`forget`). A
    thread whose bindings are not frozen yet is read every time. Bounded: when full, it
    starts over (a re-read is always correct).
    """

    def __init__(self, store: Any, limit: int = 1024) -> None:
        self.store = store
        self.limit = limit
        self._agents: dict[tuple[str, str, str], AgentDefinition] = {}  # by namespace, name, version
        self._threads: dict[str, Mapping[str, Any]] = {}

    async def get(self, conn: Connection, thread_id: str) -> tuple[AgentDefinition, Mapping[str, Any]]:
        thread = self._threads.get(thread_id)
        if thread is None:
            thread = self._read(await self.store.bindings.thread(conn, thread_id))
        return await self._with_agent(conn, thread)

    def known(self, thread_id: str) -> tuple[AgentDefinition, Mapping[str, Any]] | None:
        """What ``get`` would return, when it is kept here (no read at all); else None."""
        thread = self._threads.get(thread_id)
        agent = None if thread is None else self._agents.get(_agent_key(thread))
        return None if thread is None or agent is None else (agent, thread)

    async def get_many(
        self, conn: Connection, thread_ids: Collection[str]
    ) -> dict[str, tuple[AgentDefinition, Mapping[str, Any]]]:
        """``get`` for several threads (the turns of one claim or apply): those not kept here are
        read in one statement. A thread that is not there, or whose agent's stored definition does
        not validate, is left out: one turn's problem does not fail a claim of many."""
        # Those kept here are taken first: keeping the ones read may start the cache over.
        threads = {t: self._threads[t] for t in set(thread_ids) if t in self._threads}
        unknown = sorted(set(thread_ids) - threads.keys())
        if unknown:
            threads.update({r["id"]: self._read(r) for r in await self.store.bindings.threads(conn, unknown)})
        found = {}
        for t, thread in threads.items():
            try:
                found[t] = await self._with_agent(conn, thread)
            except SchemaError:
                continue  # that turn's own ``get`` meets it, and fails that turn alone
        return found

    def _read(self, row: Any) -> Mapping[str, Any]:
        thread = dict(row)
        if thread["bindings"] is not None:
            self._keep(self._threads, thread["id"], thread)
        return thread

    async def _with_agent(
        self, conn: Connection, thread: Mapping[str, Any]
    ) -> tuple[AgentDefinition, Mapping[str, Any]]:
        key = _agent_key(thread)
        agent = self._agents.get(key)
        if agent is None:
            try:
                agent = AgentDefinition.model_validate(await self.store.bindings.agent_definition(conn, *key))
            except ValidationError as exc:  # e.g. stored by a version of Tendon that allowed it
                raise SchemaError(
                    f"the stored definition of agent {key[1]} version {key[2]} is {invalid(exc)}"
                ) from exc
            self._keep(self._agents, key, agent)
        return agent, thread

    def forget(self, thread_id: str) -> None:
        """A thread moved to another agent version (a local development server's): read it again."""
        self._threads.pop(thread_id, None)

    def keep_frozen(self, thread: Mapping[str, Any], bindings: Mapping[str, Any]) -> None:
        """Keep a thread whose bindings a transaction froze (call after it committed)."""
        self._keep(self._threads, thread["id"], {**thread, "bindings": bindings})

    def _keep(self, cache: dict[Any, Any], key: Any, value: Any) -> None:
        if len(cache) >= self.limit:
            cache.clear()
        cache[key] = value


def _agent_key(thread: Mapping[str, Any]) -> tuple[str, str, str]:
    """Whose agent a thread runs: its namespace's, by name and version."""
    return (thread["namespace"], thread["agent_name"], thread["agent_version"])
