"""Submits: a turn accepted durably, once per request id, on a thread pinned to its agent's
version; and a submit a Brain serves, which may start the turn's run in the same commit.

The portable statements; ``brain.store.pg_submits`` makes the submits of many sessions one
statement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

from brain.rules import facts
from brain.rules.agents import AgentDefinition
from brain.rules.facts import accepted
from brain.rules.records import TERMINAL_SQL, TURN_COLUMNS, TurnRow
from brain.rules.states import TurnPhase
from brain.store.journal import JournalRows
from infra.db.store import as_time
from protocol import ConflictError, IllegalTransitionError, TendonError, digest, new_id

# What the announcements of some tools were when bindings were chosen from them: how many rows,
# and the latest time one was announced (a new row adds one; an announcement again moves it on).
Mark = tuple[int, datetime | None]


def mark_of(rows: Sequence[Mapping[str, Any]]) -> Mark:
    """The mark of announcement rows (``announced_at`` of each)."""
    return len(rows), max((as_time(r["announced_at"]) for r in rows), default=None)


MAIN_THREAD = "main"


# One read for what a submit checks: the request id, the agent, the session and the thread ($6).
# ``thread_open`` and ``thread_bound`` say whether a served submit may start the turn at once.
KNOWN_SQL = f"""SELECT t.id AS turn_id, t.input_digest, t.thread_id AS turn_thread, a.digest AS agent_digest,
                      s.namespace AS session_ns, s.closed_at AS session_closed, th.agent_name,
                      th.agent_version, th.closed_at AS thread_closed,
                      th.bindings IS NOT NULL AS thread_bound,
                      (SELECT count(*) FROM turns o
                        WHERE o.thread_id = $6 AND o.status NOT IN {TERMINAL_SQL}) AS thread_open
                 FROM (SELECT 1 AS one) AS here
                 LEFT JOIN turns t ON t.namespace = $1 AND t.session_id = $2 AND t.request_id = $3
                 LEFT JOIN agents a ON a.name = $4 AND a.version = $5
                 LEFT JOIN sessions s ON s.id = $2
                 LEFT JOIN threads th ON th.id = $6"""


def thread_id(session_id: str, thread: str) -> str:
    """A thread's id: its session's own for the main thread, else ``session/name``."""
    return session_id if thread == MAIN_THREAD else f"{session_id}/{thread}"


def check_submit(
    known: Mapping[str, Any],
    *,
    namespace: str,
    session_id: str,
    thread: str,
    request_id: str,
    input_digest: str,
    agent: AgentDefinition,
) -> str | None:
    """The existing turn of this request, None for a new one; ConflictError when the submit
    contradicts what is there (another input, thread or agent version, another namespace), and
    IllegalTransitionError when its thread or session is closed."""
    where = f"thread {thread!r} of session {session_id!r}"
    if known["turn_id"] is not None and (
        known["input_digest"] != input_digest or known["turn_thread"] != thread_id(session_id, thread)
    ):
        raise ConflictError(
            f"request id {request_id!r} in session {session_id!r} was already used "
            f"for a different input (turn {known['turn_id']})"
        )
    pinned = (known["agent_name"], known["agent_version"])
    if known["session_ns"] == namespace and pinned[0] is not None and pinned != (agent.name, agent.version):
        raise ConflictError(
            f"{where} is pinned to agent {pinned[0]} version {pinned[1]}, not "
            f"{agent.name} version {agent.version}: submit with that agent, or start another thread"
        )
    if known["turn_id"] is not None:
        return str(known["turn_id"])
    if known["session_closed"] is not None:
        raise IllegalTransitionError(f"session {session_id!r} is closed: it takes no more turns")
    if known["thread_closed"] is not None:
        raise IllegalTransitionError(f"{where} is closed: it takes no more turns")
    if known["agent_digest"] is not None and known["agent_digest"] != agent.digest:
        raise ConflictError(
            f"agent {agent.name} version {agent.version} is already registered with different "
            "content; give the changed definition a new version"
        )
    if known["session_ns"] is not None and known["session_ns"] != namespace:
        # Session ids are one space for all namespaces: say it is taken, not whose it is.
        raise ConflictError(f"session id {session_id!r} is taken: choose another")
    return None


def starts_now(known: Mapping[str, Any], start: Start) -> bool:
    """Whether a new turn's run starts in its submit's commit: its thread has no unfinished turn,
    and the thread's bindings are frozen, or it is new and every tool was announced."""
    if known["thread_open"]:
        return False
    return bool(known["thread_bound"]) or (known["agent_name"] is None and start.bindings is not None)


def frozen_by(known: Mapping[str, Any], start: Start) -> Mapping[str, Any] | None:
    """The bindings a submit that started its turn froze: those it offered, when it made the thread
    (``known``: what it found before; an existing thread keeps its own)."""
    return start.bindings if known["agent_name"] is None else None


@dataclass(frozen=True)
class Submit:
    """What a submit asks for."""

    namespace: str
    session_id: str
    request_id: str
    user_input: str
    agent: AgentDefinition
    wake_channel: str
    thread: str = MAIN_THREAD

    @cached_property
    def input_digest(self) -> str:
        return digest({"text": self.user_input})

    @property
    def thread_id(self) -> str:
        return thread_id(self.session_id, self.thread)


@dataclass(frozen=True)
class Start:
    """A served submit's offer to start the turn's run in its own commit, for ``owner``: taken when
    the thread has no unfinished turn and ``bindings`` (what a new thread freezes) or the thread's
    own are there."""

    owner: str
    lease_seconds: float
    bindings: Mapping[str, Any] | None  # None: only an existing thread, with its bindings, starts
    # The announcements ``bindings`` were chosen from (their tools and mark): a new thread freezes
    # them only if the announcements are still those; else the turn is queued (its claim chooses).
    announced: tuple[Sequence[str], Mark] | None = None


@dataclass(frozen=True)
class Submitted:
    """What a submit did: the turn, whether this call made it, and, when it started the turn's
    run, the turn as started and its journal entry."""

    turn_id: str
    created: bool
    started: TurnRow | None = None
    seq: int | None = None
    facts: Sequence[Mapping[str, Any]] = ()
    froze: Mapping[str, Any] | None = None  # the bindings of the thread it made (a started turn's)
    stale: bool = False  # the offered bindings' announcements had changed: they were not used


def submit_facts(s: Submit, start: Start | None) -> list[dict[str, Any]]:
    """The journal entry of a submit: the turn accepted, and when it starts now, its first run
    and its input prepared (what a claim and its prepare would journal)."""
    return [accepted(s.request_id, s.user_input), *(started_facts(start) if start is not None else ())]


def started_facts(start: Start) -> list[dict[str, Any]]:
    """What a submit that starts its turn's run adds to its journal entry."""
    return [facts.run_started(1, 1, str(TurnPhase.PREPARE), start.owner), facts.prepared()]


def raised(done: Submitted | TendonError) -> Submitted:
    """A submit's outcome from :meth:`SubmitRows.submit_batch`, its refusal raised."""
    if isinstance(done, TendonError):
        raise done
    return done


class SubmitRows(JournalRows):
    async def submit(self, submit: Submit) -> tuple[str, bool]:
        """Accept a turn durably; returns (turn id, created now). See ``brain.verbs.sessions.submit``."""

        async def work(conn: Any) -> Submitted:
            return await self.submit_in(conn, submit, None)

        done = await self.transact(work, single_statement=True, read_then_insert=True)
        return done.turn_id, done.created

    async def submit_served(self, s: Submit, start: Start) -> Submitted:
        """A submit that starts the turn's run at once when its thread is idle (``start``), alone:
        what ``brain.run.claims.Served`` does for the submits that arrive together
        (:meth:`submit_batch`). A refusal raises."""
        items = [(s, start)]
        (done,) = await self.transact(
            lambda conn: self.submit_batch(conn, items),
            single_statement=self.submits_in_one_statement(items), read_then_insert=True,
        )  # fmt: skip
        return raised(done)

    def submits_in_one_statement(self, items: Sequence[tuple[Submit, Start | None]]) -> bool:
        """Whether :meth:`submit_batch` writes ``items`` with one statement (which then commits
        on its own where the backend allows it)."""
        return False

    async def submit_batch(
        self, conn: Any, items: Sequence[tuple[Submit, Start | None]]
    ) -> list[Submitted | TendonError]:
        """The submits of ``items`` in the caller's transaction (a served one, with its ``Start``,
        on its thread's lock), each with its own outcome: one that its checks refuse is that
        item's error, and the others go on (the checks refuse before anything is written)."""
        done: list[Submitted | TendonError] = []
        for s, start in items:
            if start is not None:
                await self.lock_thread(conn, s.thread_id)
            try:
                done.append(await self.submit_in(conn, s, start))
            except (ConflictError, IllegalTransitionError) as exc:
                done.append(exc)
        return done

    async def lock_thread(self, conn: Any, thread_id: str) -> None:
        """Lock the thread (if it is there) until the caller's transaction ends (on SQLite, which
        runs one write transaction at a time, the transaction is the lock)."""
        await conn.fetchrow(f"SELECT id FROM threads WHERE id = $1{self.FOR_UPDATE}", thread_id)

    async def binding_rows(self, conn: Any, tools: Sequence[str]) -> list[Any]:
        """The announcements of ``tools`` (``name``, ``binding``, ``announced_at``: a row per pool
        and version; one statement where the backend can)."""
        rows = []
        for name in tools:
            rows += await conn.fetch("SELECT name, binding, announced_at FROM bindings WHERE name = $1", name)
        return rows

    async def _still_announced(self, conn: Any, known: Mapping[str, Any], start: Start) -> bool:
        """Whether the announcements a new thread's offered bindings were chosen from are still
        those (an existing thread keeps its own: nothing to check)."""
        if start.announced is None or known["agent_name"] is not None:
            return True
        tools, mark = start.announced
        return mark_of(await self.binding_rows(conn, tools)) == mark

    async def submit_in(self, conn: Any, s: Submit, start: Start | None) -> Submitted:
        """A submit inside the caller's transaction, which starts the turn's run when ``start``
        offers it and the thread is idle (what ``submit_served`` does, given the thread's lock)."""
        agent = s.agent
        known = await conn.fetchrow(
            KNOWN_SQL, s.namespace, s.session_id, s.request_id, agent.name, agent.version, s.thread_id
        )
        existing = check_submit(
            known, namespace=s.namespace, session_id=s.session_id, thread=s.thread, request_id=s.request_id,
            input_digest=s.input_digest, agent=agent,
        )  # fmt: skip
        if existing is not None:
            return Submitted(existing, False)
        stale = start is not None and not await self._still_announced(conn, known, start)
        if start is not None and (stale or not starts_now(known, start)):
            start = None
        if known["agent_digest"] is None:
            await conn.execute(
                "INSERT INTO agents (name, version, digest, definition) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT DO NOTHING",
                agent.name,
                agent.version,
                agent.digest,
                agent.stored,
            )
        if known["session_ns"] is None:
            await conn.execute(
                "INSERT INTO sessions (id, namespace) VALUES ($1, $2)", s.session_id, s.namespace
            )
        if known["agent_name"] is None:
            await conn.execute(
                "INSERT INTO threads (id, session_id, name, agent_name, agent_version, bindings)"
                " VALUES ($1, $2, $3, $4, $5, $6)",
                s.thread_id, s.session_id, s.thread, agent.name, agent.version,
                start.bindings if start is not None else None,
            )  # fmt: skip
        turn_id = f"turn-{new_id()}"
        status, phase = ("running", "model_request") if start is not None else ("queued", "prepare")
        await conn.execute(
            """INSERT INTO turns (id, namespace, session_id, thread_id, request_id, input_digest, status,
                                 phase, lease_owner, lease_epoch, runs, lease_expires_at)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, ts_add(now(), $11))""",
            turn_id, s.namespace, s.session_id, s.thread_id, s.request_id, s.input_digest, status, phase,
            start.owner if start else None, 1 if start else 0, start.lease_seconds if start else None,
        )  # fmt: skip
        said = submit_facts(s, start)
        seq = await self.append(
            conn, s.session_id, turn_id, said, thread_id=s.thread_id, status=status, phase=phase
        )
        if start is None:
            await conn.execute("SELECT pg_notify($1, '')", s.wake_channel)
            return Submitted(turn_id, True, stale=stale)
        row = await conn.fetchrow(f"SELECT {TURN_COLUMNS} FROM turns WHERE id = $1", turn_id)
        return Submitted(turn_id, True, TurnRow.from_record(row), seq, said, frozen_by(known, start))
