"""Migration 0017 keys sessions, threads and agents by namespace and keeps what was there: a store
written before it (sessions, threads, turns, journal and agents as they were) reads and goes on
the same afterwards, and a new namespace can use its session ids and agent versions for its own.
On both backends."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from brain import verbs
from brain.rules.agents import AgentDefinition
from brain.store import MIGRATIONS, BrainStore, brain_store
from brain.verbs import observe
from brain.verbs.describe import describe
from infra.db import Pool, create_pool, dialect, migrate, migration_files
from infra.db.sqlite import open_pool
from protocol import ConflictError, digest
from tests.support import TendonEnv

NEW = 17  # the migration under test


def agent(name: str, instructions: str) -> AgentDefinition:
    model = {"kind": "scripted", "script": [{"content": "hi"}]}
    return AgentDefinition.model_validate(
        {"name": name, "version": "1", "instructions": instructions, "model": model}
    )


SUPPORT, HELPER = agent("support", "as before"), agent("helper", "never run")


@pytest.fixture(params=["postgres", "sqlite"])
async def pool(request: pytest.FixtureRequest, tendon: TendonEnv, tmp_path: Path) -> AsyncIterator[Pool]:
    if request.param == "postgres":
        settings = tendon.settings()
        p: Pool = await create_pool(settings.database_url, settings.brain_schema)
    else:
        p = await open_pool(tmp_path / "brain.sqlite3")
    yield p
    await p.close()


async def migrate_before(pool: Pool, schema: str, tmp_path: Path) -> None:
    """The schema as it was before the migration under test."""
    kind = dialect(pool)
    (tmp_path / "old" / kind).mkdir(parents=True)
    for version, path in migration_files(MIGRATIONS, kind):
        if version < NEW:
            shutil.copy(path, tmp_path / "old" / kind / path.name)
    await migrate(pool, schema, tmp_path / "old")


async def write_as_before(pool: Pool) -> None:
    """Namespace acme's session s1 (threads main and side, two turns, their journal) and beta's
    session t1, both on agent support version 1, and agent helper that no thread runs."""
    for a in (SUPPORT, HELPER):
        await pool.execute(
            "INSERT INTO agents (name, version, digest, definition) VALUES ($1, $2, $3, $4)",
            a.name, a.version, a.digest, a.stored,
        )  # fmt: skip
    for session, namespace, last in (("s1", "acme", 2), ("t1", "beta", 1)):
        await pool.execute(
            "INSERT INTO sessions (id, namespace, last_seq) VALUES ($1, $2, $3)", session, namespace, last
        )
    turns = [
        ("turn-a1", "acme", "s1", "s1", "main", "r1", 1),
        ("turn-a2", "acme", "s1", "s1/side", "side", "r2", 2),
        ("turn-b1", "beta", "t1", "t1", "main", "r1", 1),
    ]
    for turn, namespace, session, thread, name, request, seq in turns:
        await pool.execute(
            """INSERT INTO threads (id, session_id, name, agent_name, agent_version)
               SELECT $1, $2, $3, 'support', '1' WHERE NOT EXISTS (SELECT 1 FROM threads WHERE id = $1)""",
            thread, session, name,
        )  # fmt: skip
        await pool.execute(
            """INSERT INTO turns (id, namespace, session_id, thread_id, request_id, input_digest,
                                  status, phase) VALUES ($1, $2, $3, $4, $5, $6, 'queued', 'prepare')""",
            turn, namespace, session, thread, request, digest({"text": "hello"}),
        )  # fmt: skip
        await pool.execute(
            """INSERT INTO journal (session_id, seq, thread_id, turn_id, status, phase, facts)
               VALUES ($1, $2, $3, $4, 'queued', 'prepare', $5)""",
            session, seq, thread, turn,
            [{"kind": "turn.accepted", "request_id": request, "input": {"text": "hello"}}],
        )  # fmt: skip


async def submit(store: BrainStore, namespace: str, session: str, request: str, a: Any, **kw: Any) -> Any:
    return await verbs.submit(
        store, namespace=namespace, session_id=session, request_id=request, user_input="hello", agent=a,
        wake_channel="wake", **kw,
    )  # fmt: skip


async def test_a_store_from_before_keeps_its_sessions_threads_turns_journal_and_agents(
    pool: Pool, tendon: TendonEnv, tmp_path: Path
) -> None:
    # Given a store written before the migration
    schema = tendon.settings().brain_schema if dialect(pool) == "postgres" else "brain"
    await migrate_before(pool, schema, tmp_path)
    await write_as_before(pool)
    # When it is migrated
    later = [v for v, _ in migration_files(MIGRATIONS, dialect(pool)) if v >= NEW]
    assert await migrate(pool, schema, MIGRATIONS) == len(later)
    store = brain_store(pool)
    # Then its turns, their threads and their journal read as before, in their namespace
    side = await describe(store, "acme", "turn-a2")
    assert (side["session_id"], side["thread"], side["request_id"]) == ("s1", "side", "r2")
    listed = await verbs.turns(store, namespace="acme", session_id="s1")
    assert [(t["id"], t["thread"], t["input"]) for t in listed] == [
        ("turn-a1", "main", "hello"), ("turn-a2", "side", "hello"),
    ]  # fmt: skip
    page = await observe.list_events(store, namespace="acme", session_id="s1")
    assert [(e["seq"], e["thread"], e["turn_id"]) for e in page.events] == [
        (1, "main", "turn-a1"), (2, "side", "turn-a2"),
    ]  # fmt: skip
    assert [t["id"] for t in await verbs.threads(store, namespace="beta", session_id="t1")] == ["t1"]
    # And its request ids and sessions go on: a known request finds its turn, a new one continues
    # the session's journal on its thread, pinned to the agent it had
    assert await submit(store, "acme", "s1", "r1", SUPPORT) == ("turn-a1", False)
    turn, created = await submit(store, "acme", "s1", "r3", SUPPORT, thread="side")
    assert created and (await describe(store, "acme", turn))["thread"] == "side"
    page = await observe.list_events(store, namespace="acme", session_id="s1", cursor=2)
    assert [(e["seq"], e["turn_id"]) for e in page.events] == [(3, turn)]
    thread = await store.read(lambda c: store.bindings.thread(c, "acme/s1"))
    assert (thread["namespace"], thread["agent_name"], thread["agent_version"]) == ("acme", "support", "1")
    # And each namespace that ran an agent version keeps it, one that none ran is kept for every
    # namespace (who registered it was not recorded)
    for namespace, a in (("acme", SUPPORT), ("beta", SUPPORT), ("acme", HELPER), ("beta", HELPER)):
        changed = a.model_copy(update={"instructions": "changed"})
        with pytest.raises(ConflictError, match="already registered with different content"):
            await submit(store, namespace, "new", "r1", changed)
    # And the session ids and agent versions of a namespace new here are its own
    _, created = await submit(store, "gamma", "s1", "r1", agent("support", "gamma's own"))
    assert created
    assert [t["id"] for t in await verbs.turns(store, namespace="acme", session_id="s1")] == [
        "turn-a1", "turn-a2", turn,
    ]  # fmt: skip
