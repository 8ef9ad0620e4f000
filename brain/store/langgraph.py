"""What the LangGraph-compatible API keeps beside Tendon's own rows (``brain.api.langgraph``):
assistants and their numbered versions, and runs (a turn, or the same turn resumed by an answer).
A LangGraph thread is a session: it is made here before its first turn, and its metadata is the
session's (``Metadata``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from brain.rules.states import WAITING_FOR_A_PERSON
from brain.store.part import Part
from brain.store.sql import TERMINAL_SQL, in_list
from infra.db import Connection, Json, Row

PERSON_SQL = in_list(WAITING_FOR_A_PERSON)  # the statuses of an execution that waits for a person
_ASSISTANT = """SELECT a.id, a.graph_id, a.version AS latest, a.created_at, a.updated_at, v.version,
                       v.agent_version, v.body, v.created_at AS version_created_at
                  FROM langgraph_assistants a
                  JOIN langgraph_assistant_versions v
                    ON v.namespace = a.namespace AND v.assistant_id = a.id"""
_RUN = (
    "SELECT id, namespace, session_id, turn_id, schedule_id, start_seq, body, created_at FROM langgraph_runs"
)


class LangGraph(Part):
    async def assistant(
        self, conn: Connection, namespace: str, assistant_id: str, version: int | None = None
    ) -> Row | None:
        """An assistant at ``version`` (None: the one its runs use)."""
        pick = "v.version = a.version" if version is None else "v.version = $3"
        args: list[Any] = [namespace, assistant_id] + ([] if version is None else [version])
        return await conn.fetchrow(f"{_ASSISTANT} WHERE a.namespace = $1 AND a.id = $2 AND {pick}", *args)

    async def assistants(self, conn: Connection, namespace: str, graph_id: str | None) -> list[Row]:
        """The namespace's assistants at the versions their runs use, newest first."""
        return list(
            await conn.fetch(
                f"""{_ASSISTANT} WHERE a.namespace = $1 AND v.version = a.version
                      AND (CAST($2 AS text) IS NULL OR a.graph_id = $2)
                    ORDER BY a.created_at DESC, a.id""",
                namespace,
                graph_id,
            )
        )

    async def versions(self, conn: Connection, namespace: str, assistant_id: str) -> list[Row]:
        """Every version of an assistant, the newest first."""
        return list(
            await conn.fetch(
                f"{_ASSISTANT} WHERE a.namespace = $1 AND a.id = $2 ORDER BY v.version DESC",
                namespace,
                assistant_id,
            )
        )

    async def add_assistant(self, conn: Connection, namespace: str, assistant_id: str, graph_id: str) -> bool:
        """A new assistant (at version 1, to be added); False when the id is taken."""
        done = await conn.fetchval(
            """INSERT INTO langgraph_assistants (namespace, id, graph_id, version) VALUES ($1, $2, $3, 1)
               ON CONFLICT DO NOTHING RETURNING id""",
            namespace,
            assistant_id,
            graph_id,
        )
        return done is not None

    async def add_version(
        self, conn: Connection, namespace: str, assistant_id: str, agent_version: str, body: Mapping[str, Any]
    ) -> int:
        """A new version of an assistant, which its runs use from now on; its number."""
        row = await conn.fetchrow(
            "SELECT coalesce(max(version), 0) + 1 AS next FROM langgraph_assistant_versions"
            " WHERE namespace = $1 AND assistant_id = $2",
            namespace,
            assistant_id,
        )
        number = int(row["next"]) if row is not None else 1
        await conn.execute(
            """INSERT INTO langgraph_assistant_versions
                      (namespace, assistant_id, version, agent_version, body)
               VALUES ($1, $2, $3, $4, $5)""",
            namespace, assistant_id, number, agent_version, Json(dict(body)),
        )  # fmt: skip
        await self.set_latest(conn, namespace, assistant_id, number)
        return number

    async def set_latest(self, conn: Connection, namespace: str, assistant_id: str, version: int) -> None:
        await conn.execute(
            "UPDATE langgraph_assistants SET version = $3, updated_at = now()"
            " WHERE namespace = $1 AND id = $2",
            namespace,
            assistant_id,
            version,
        )

    async def delete_assistant(self, conn: Connection, namespace: str, assistant_id: str) -> bool:
        for table, column in (
            ("langgraph_assistant_versions", "assistant_id"),
            ("langgraph_assistants", "id"),
        ):
            await conn.execute(
                f"DELETE FROM {table} WHERE namespace = $1 AND {column} = $2", namespace, assistant_id
            )
        return True

    async def latest_agent(self, conn: Connection, namespace: str, name: str) -> Any:
        """The definition of the agent ``name`` registered last in the namespace (None: none)."""
        return await conn.fetchval(
            "SELECT definition FROM agents WHERE namespace = $1 AND name = $2"
            " ORDER BY created_at DESC LIMIT 1",
            namespace,
            name,
        )

    async def register_agent(self, conn: Connection, namespace: str, agent: Any) -> None:
        """Keep an agent definition's version in the namespace (as a submit would)."""
        await conn.execute(
            """INSERT INTO agents (namespace, name, version, digest, definition) VALUES ($1, $2, $3, $4, $5)
               ON CONFLICT DO NOTHING""",
            namespace, agent.name, agent.version, agent.digest, agent.stored,
        )  # fmt: skip

    async def thread_state(self, conn: Connection, thread_id: str) -> Row | None:
        """A main thread's session's time and its journal's latest, its latest turn (its status),
        how many of its turns are unfinished, and how many of its calls wait for a person."""
        return await conn.fetchrow(
            f"""SELECT (SELECT s.created_at FROM sessions s WHERE s.id = $1) AS created_at,
                       (SELECT j.created_at FROM journal j WHERE j.session_id = $1
                         ORDER BY j.seq DESC LIMIT 1) AS updated_at,
                       (SELECT t.id FROM turns t WHERE t.thread_id = $1
                         ORDER BY t.seq DESC LIMIT 1) AS last_turn,
                       (SELECT t.status FROM turns t WHERE t.thread_id = $1
                         ORDER BY t.seq DESC LIMIT 1) AS last_status,
                       (SELECT count(*) FROM turns t
                         WHERE t.thread_id = $1 AND t.status NOT IN {TERMINAL_SQL}) AS unfinished,
                       (SELECT count(*) FROM executions e JOIN turns t ON t.id = e.turn_id
                         WHERE t.thread_id = $1 AND e.status IN {PERSON_SQL}
                           AND t.status NOT IN {TERMINAL_SQL}) AS pending""",
            thread_id,
        )

    async def add_run(
        self, conn: Connection, run_id: str, namespace: str, session_id: str, turn_id: str | None,
        body: Mapping[str, Any], *, start_seq: int = 0, schedule_id: str | None = None,
    ) -> None:  # fmt: skip
        await conn.execute(
            """INSERT INTO langgraph_runs (id, namespace, session_id, turn_id, schedule_id, start_seq, body)
               VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING""",
            run_id, namespace, session_id, turn_id, schedule_id, start_seq, Json(dict(body)),
        )  # fmt: skip
        if body.get("webhook"):  # tried once the run's turn ended (brain.run.webhooks)
            await self.add_webhook(conn, run_id, str(body["webhook"]))

    async def run(self, conn: Connection, namespace: str, run_id: str) -> Row | None:
        return await conn.fetchrow(f"{_RUN} WHERE id = $1 AND namespace = $2", run_id, namespace)

    async def runs_of(self, conn: Connection, session_id: str) -> list[Row]:
        """A session's runs, the newest first."""
        return list(
            await conn.fetch(f"{_RUN} WHERE session_id = $1 ORDER BY created_at DESC, id", session_id)
        )

    async def runs_of_turns(self, conn: Connection, turn_ids: Sequence[str]) -> list[Row]:
        found: list[Row] = []
        for turn_id in turn_ids:
            found += await conn.fetch(f"{_RUN} WHERE turn_id = $1 ORDER BY created_at, id", turn_id)
        return found

    async def set_turn(self, conn: Connection, run_id: str, turn_id: str) -> None:
        """The turn a delayed run's schedule submitted."""
        await conn.execute("UPDATE langgraph_runs SET turn_id = $2 WHERE id = $1", run_id, turn_id)

    async def turn_states(self, conn: Connection, turn_ids: Sequence[str]) -> dict[str, Row]:
        """Each turn's status and time, how many of its calls wait for a person, and whether a
        rollback took its messages out of its thread (its ``turn.rolled_back`` fact)."""
        found: dict[str, Row] = {}
        for turn_id in turn_ids:
            row = await conn.fetchrow(
                f"""SELECT t.id, t.status, t.created_at, t.updated_at,
                          (SELECT count(*) FROM executions e
                            WHERE e.turn_id = t.id AND e.status IN {PERSON_SQL})
                              AS pending,
                          (SELECT count(*) FROM journal j
                            WHERE j.session_id = t.session_id AND j.turn_id = t.id
                              AND CAST(j.facts AS text) LIKE '%turn.rolled_back%') AS rolled_back
                     FROM turns t WHERE t.id = $1""",
                turn_id,
            )
            if row is not None:
                found[turn_id] = row
        return found

    async def add_webhook(self, conn: Connection, run_id: str, url: str) -> None:
        """A run's webhook, in the transaction that keeps the run's row."""
        await conn.execute(
            "INSERT INTO langgraph_webhooks (run_id, url) VALUES ($1, $2) ON CONFLICT DO NOTHING", run_id, url
        )

    async def due_webhooks(self, conn: Connection, limit: int) -> list[Row]:
        """Webhooks to try now: their run's turn ended or waits for a person."""
        return list(
            await conn.fetch(
                f"""SELECT w.run_id, w.url, w.attempts, r.namespace, r.session_id, r.turn_id, r.body,
                           t.status AS turn_status,
                           (SELECT count(*) FROM executions e
                             WHERE e.turn_id = t.id AND e.status IN {PERSON_SQL}) AS pending
                      FROM langgraph_webhooks w
                      JOIN langgraph_runs r ON r.id = w.run_id
                      JOIN turns t ON t.id = r.turn_id
                     WHERE w.status = 'pending' AND w.next_at <= now()
                       AND (t.status IN {TERMINAL_SQL} OR EXISTS (
                            SELECT 1 FROM executions e WHERE e.turn_id = t.id AND e.status IN {PERSON_SQL}))
                     ORDER BY w.next_at LIMIT $1""",
                limit,
            )
        )

    async def take_webhook(self, conn: Connection, run_id: str, attempts: int, lease: float) -> bool:
        """Take a due webhook for ``lease`` seconds (another Brain's look then passes it by); False
        when another took it first."""
        done = await conn.fetchval(
            """UPDATE langgraph_webhooks SET next_at = ts_add(now(), $3)
                WHERE run_id = $1 AND attempts = $2 AND status = 'pending' AND next_at <= now()
               RETURNING run_id""",
            run_id, attempts, lease,
        )  # fmt: skip
        return done is not None

    async def webhook_tried(
        self, conn: Connection, run_id: str, status: str, error: str | None, delay: float
    ) -> None:
        """One more try of a webhook: ``delivered``, ``failed`` (given up) or ``pending`` again in
        ``delay`` seconds."""
        await conn.execute(
            """UPDATE langgraph_webhooks
                  SET attempts = attempts + 1, status = $2, last_error = $3, next_at = ts_add(now(), $4),
                      delivered_at = CASE WHEN $2 = 'delivered' THEN now() ELSE delivered_at END
                WHERE run_id = $1""",
            run_id, status, error, delay,
        )  # fmt: skip

    async def webhook(self, conn: Connection, run_id: str) -> Row | None:
        return await conn.fetchrow(
            "SELECT run_id, url, status, attempts, last_error, delivered_at FROM langgraph_webhooks"
            " WHERE run_id = $1",
            run_id,
        )
