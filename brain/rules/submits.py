"""What a submit asks and what it did, and the rules that decide it from what the store found:
the existing turn of a request id, a CONFLICT, a closed thread or session, and whether a served
submit starts its turn's run in its own commit (``brain.store.submits`` reads and writes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

from brain.rules import facts
from brain.rules.agents import AgentDefinition
from brain.rules.doubletext import Strategy
from brain.rules.facts import accepted
from brain.rules.records import TurnRow
from brain.rules.states import TurnPhase
from protocol import ConflictError, IllegalTransitionError, TendonError, digest

# What the announcements of some tools were when bindings were chosen from them: how many rows,
# and the latest time one was announced (a new row adds one; an announcement again moves it on).
Mark = tuple[int, datetime | None]

MAIN_THREAD = "main"


def session_key(namespace: str, session_id: str) -> str:
    """How the store keys a session: ``namespace/session id``. A session id belongs to its
    namespace (another namespace may use the same one for its own session), and everything keyed
    by a session (its threads, turns, journal, previews) is then kept apart by construction.
    Namespaces hold no ``/`` (``check_namespace``), so two keys never meet."""
    return f"{namespace}/{session_id}"


def shown_session(namespace: str, key: str) -> str:
    """The session id its namespace gave, from the store's key of it (``session_key``)."""
    return key.removeprefix(f"{namespace}/")


def thread_id(session: str, thread: str) -> str:
    """A thread's id from its session's key: the session's own for the main thread, else
    ``session/name``."""
    return session if thread == MAIN_THREAD else f"{session}/{thread}"


def thread_name(session: str, thread_id: str) -> str:
    """A thread's name, from its id and its session's key (``thread_id`` read back)."""
    return thread_id.removeprefix(session).removeprefix("/") or MAIN_THREAD


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
    contradicts what is there (another input, thread or agent version), and IllegalTransitionError
    when its thread or session is closed. ``known`` is what the submit's namespace holds: another
    namespace's sessions and agents are not there."""
    where = f"thread {thread!r} of session {session_id!r}"
    if known["turn_id"] is not None and (
        known["input_digest"] != input_digest
        or known["turn_thread"] != thread_id(session_key(namespace, session_id), thread)
    ):
        raise ConflictError(
            f"request id {request_id!r} in session {session_id!r} was already used "
            f"for a different input (turn {known['turn_id']})"
        )
    pinned = (known["agent_name"], known["agent_version"])
    if pinned[0] is not None and pinned != (agent.name, agent.version):
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
    schedule: dict[str, Any] | None = None  # the schedule that submits it, and its firing's words
    strategy: Strategy = Strategy.ENQUEUE  # what it does when its thread is busy

    @cached_property
    def input_digest(self) -> str:
        return digest({"text": self.user_input})

    @property
    def session_key(self) -> str:
        return session_key(self.namespace, self.session_id)

    @property
    def thread_id(self) -> str:
        return thread_id(self.session_key, self.thread)

    @property
    def where(self) -> str:
        return f"thread {self.thread!r} of session {self.session_id!r}"


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
    started = started_facts(start) if start is not None else ()
    return [accepted(s.request_id, s.user_input, s.schedule), *started]


def started_facts(start: Start) -> list[dict[str, Any]]:
    """What a submit that starts its turn's run adds to its journal entry."""
    return [facts.run_started(1, 1, str(TurnPhase.PREPARE), start.owner), facts.prepared()]


def raised(done: Submitted | TendonError) -> Submitted:
    """A submit's outcome from ``Submits.submit_batch``, its refusal raised."""
    if isinstance(done, TendonError):
        raise done
    return done
