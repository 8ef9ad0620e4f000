"""On PostgreSQL: a thread copy (``brain.verbs.forks.copy``) makes its session, metadata and main
thread with the source's lineage and agent version in one transaction; a run's webhook row is kept
with the run's, is not due while its turn runs, is taken once for a lease, and records its tries.
(The same statements on SQLite are driven end to end by test_langgraph_copy and
test_langgraph_webhook.)"""

from __future__ import annotations

from brain.store import open_store
from brain.store.metadata import SESSION
from brain.verbs import forks, submit
from brain.verbs.sessions import threads
from local.testing import agent_of
from tests.support import TendonEnv


async def test_on_postgresql_a_copy_and_a_webhooks_rows_do_what_they_say(tendon: TendonEnv) -> None:
    store = await open_store(tendon.settings())
    try:
        model = {"kind": "scripted", "script": [{"content": "hi"}]}
        spec = {"name": "pg-copier", "version": "1", "model": model}
        turn, _ = await submit(
            store, namespace="ns", session_id="s-src", request_id="run-1", user_input="hello",
            agent=agent_of(spec), wake_channel="wake",
        )  # fmt: skip
        await store.transact(lambda conn: store.metadata.set(conn, SESSION, "ns/s-src", {"user": "ada"}))
        made = await forks.copy(store, "ns", "s-src", "s-copy")
        assert (made["session_id"], made["copied_from"]) == ("s-copy", "s-src")
        (main,) = await threads(store, namespace="ns", session_id="s-copy")
        assert (main["name"], main["forked_from"], main["agent_version"]) == ("main", "s-src", "1")
        pairs = await store.read(lambda conn: store.metadata.of(conn, SESSION, ["ns/s-copy"]))
        assert pairs == {"ns/s-copy": {"user": "ada"}}

        # A run's webhook row, kept with the run's
        body = {"assistant_id": "pg-copier", "webhook": "http://127.0.0.1:9/hook"}
        await store.transact(
            lambda conn: store.langgraph.add_run(conn, "run-1", "ns", "ns/s-src", turn, body)
        )
        # not due while its turn has not ended (it is queued: no Brain runs here)
        assert await store.read(lambda conn: store.langgraph.due_webhooks(conn, 10)) == []
        # taken once for a lease, then a try recorded
        take = store.langgraph.take_webhook
        assert await store.transact(lambda conn: take(conn, "run-1", 0, 30.0))
        assert not await store.transact(lambda conn: take(conn, "run-1", 0, 30.0))
        await store.transact(
            lambda conn: store.langgraph.webhook_tried(conn, "run-1", "pending", "HTTP 500", 0.5)
        )
        row = await store.read(lambda conn: store.langgraph.webhook(conn, "run-1"))
        assert (row["status"], row["attempts"], row["last_error"]) == ("pending", 1, "HTTP 500")
        await store.transact(
            lambda conn: store.langgraph.webhook_tried(conn, "run-1", "delivered", None, 0.0)
        )
        row = await store.read(lambda conn: store.langgraph.webhook(conn, "run-1"))
        assert (row["status"], row["attempts"]) == ("delivered", 2) and row["delivered_at"] is not None
    finally:
        await store.close()
