"""Making, reading and cancelling runs. A new run is a submit to the thread's main thread (its
request id is the run's id, so a run is found by its turn even if the row beside it is lost); a
resume is a person's answer to each interrupt it names (``/v1/turns/{id}/respond``) and a run row
on the same turn, whose stream starts at the interrupt; a delayed run (``after_seconds``) is a
once-schedule (``/v1/schedules``) whose turn the run is once it fired."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from brain import verbs
from brain.api.app import Api
from brain.api.langgraph import state as states
from brain.api.langgraph.assistants import agent_of
from brain.api.langgraph.common import GRAPH_INTERNALS, NotSupported, refuse, thread_key, when
from brain.api.langgraph.messages import MODES
from brain.api.langgraph.threads import found, make
from brain.rules.langgraph import answers, run_status, webhook_url
from brain.rules.submits import MAIN_THREAD, shown_session
from brain.store import BrainStore
from brain.verbs import controls
from brain.verbs import schedules as schedule_verbs
from infra.db import Connection
from protocol import IllegalTransitionError, NotFoundError, SchemaError

STRATEGIES = ("reject", "enqueue", "interrupt", "rollback")
SETTINGS = "a Tendon agent's settings are its definition: make an assistant version with them (context.agent)"


@dataclass
class Run:
    """A run's row, as the routes use it."""

    run_id: str
    thread_id: str  # as the client names it
    key: str  # the session's store key
    turn_id: str | None
    start_seq: int
    body: dict[str, Any]
    created_at: Any
    schedule_id: str | None = None

    @classmethod
    def of(cls, namespace: str, row: Any) -> Run:
        key = row["session_id"]
        return cls(row["id"], shown_session(namespace, key), key, row["turn_id"], int(row["start_seq"]),
                   dict(row["body"]), row["created_at"], row["schedule_id"])  # fmt: skip

    @property
    def modes(self) -> list[str]:
        return list(self.body.get("stream_mode") or ["values"])


def stream_modes(value: Any) -> list[str]:
    modes = [value] if isinstance(value, str) else list(value or ["values"])
    for mode in modes:
        if mode not in MODES:
            raise NotSupported(f"stream mode {mode!r}: Tendon streams {', '.join(MODES)}")
    return modes


def text_of(given: Any) -> str:
    """A run's input: ``{"messages": [...]}`` with one human message (its text is the turn's input)."""
    messages = given.get("messages") if isinstance(given, dict) else None
    if not isinstance(messages, list) or len(messages) != 1 or not isinstance(messages[0], dict):
        raise SchemaError("a run's input is {\"messages\": [one user message]}: the turn's input")
    message = messages[0]
    if message.get("type", message.get("role", "human")) not in ("human", "user"):
        raise NotSupported("an input message that is not the user's: Tendon's thread keeps its own replies")
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    if not isinstance(content, str):
        raise SchemaError("a user message's content is text (or a list of text parts)")
    return content


async def create(api: Api, namespace: str, thread_id: str | None, body: dict[str, Any]) -> Run:
    """A run of ``body`` on the thread (a new one when ``thread_id`` is None); returns its row."""
    internals = {
        k: v for k, v in GRAPH_INTERNALS.items() if k not in ("checkpoint", "checkpoint_id", "webhook")
    }
    refuse(body, {**internals, "context": SETTINGS})
    configurable = (
        (body.get("config") or {}).get("configurable") if isinstance(body.get("config"), dict) else None
    )
    if isinstance(configurable, dict) and set(configurable) - {"thread_id"}:
        raise NotSupported(f"a run's `config.configurable`: {SETTINGS}")
    if body.get("on_completion") not in (None, "keep"):
        raise NotSupported("on_completion=delete: a thread is deleted by DELETE /threads/{id}")
    strategy = body.get("multitask_strategy") or "reject"
    if strategy not in STRATEGIES:
        raise SchemaError(f"multitask_strategy is one of {', '.join(STRATEGIES)}")
    kept = {"assistant_id": body.get("assistant_id"), "metadata": body.get("metadata") or {},
            "multitask_strategy": strategy, "stream_mode": stream_modes(body.get("stream_mode")),
            "on_disconnect": body.get("on_disconnect") or "continue"}  # fmt: skip
    if not isinstance(kept["assistant_id"], str):
        raise SchemaError("a run names its assistant_id (an assistant's id, or an agent's name)")
    if body.get("webhook") is not None:  # kept with the run's row (brain.run.webhooks)
        kept["webhook"] = webhook_url(body["webhook"], private=api.webhook_private)
        if body.get("after_seconds"):
            raise NotSupported("a webhook on a delayed run (after_seconds): not built yet")
    if thread_id is None or body.get("if_not_exists") == "create":
        thread_id = thread_id or str(uuid.uuid4())
        await make(api.store, namespace, thread_id, {}, "do_nothing")
    elif body.get("if_not_exists") not in (None, "reject"):
        raise SchemaError("if_not_exists is create or reject")
    thread = await found(api.store, namespace, thread_id)
    _from_latest(body, thread_id, thread)
    command = body.get("command") or {}
    refuse(command, {"goto": "Tendon's agents have no nodes to go to", "update": "a run adds messages"})
    if "resume" in command:
        return await _resume(api, namespace, thread_id, thread, command["resume"], kept)
    agent, _ = await agent_of(api.store, namespace, kept["assistant_id"])
    text, run_id = text_of(body.get("input")), str(uuid.uuid4())
    after = body.get("after_seconds")
    if after:
        if api.edits is not None:  # as a development server's submit would version it
            agent = agent.versioned_by_content()
        return await _delayed(api, namespace, thread_id, run_id, agent, text, float(after), kept)
    turn_id, _ = await verbs.submit(
        api.store, namespace=namespace, session_id=thread_id, request_id=run_id, user_input=text, agent=agent,
        wake_channel=api.wake_channel, served=api.served, follow_edits=api.edits, tools=api.tools,
        strategy=strategy, topology=api.topology, ended=api.ended, send=api.controls,
    )  # fmt: skip
    await api.store.transact(
        lambda conn: api.store.langgraph.add_run(conn, run_id, namespace, thread.key, turn_id, kept)
    )
    return await get(api, namespace, thread_id, run_id)


def _from_latest(body: dict[str, Any], thread_id: str, thread: states.Thread) -> None:
    """A run may name the thread's latest checkpoint (what it runs from anyway: a client that
    branches names it); another is refused, named."""
    given = body.get("checkpoint")
    asked = body.get("checkpoint_id") or (given.get("checkpoint_id") if isinstance(given, dict) else given)
    if asked is None:
        return
    latest = states.state(thread_id, thread)["checkpoint"]["checkpoint_id"]
    if str(asked) != latest:
        raise NotSupported(
            f"`checkpoint_id` {str(asked)[:40]!r}: a run goes on from the thread's latest checkpoint "
            f"({latest}), never from an earlier one (branches are not built here)"
        )


async def _resume(
    api: Api, namespace: str, thread_id: str, thread: states.Thread, resume: Any, kept: dict[str, Any]
) -> Run:
    """Answer the interrupts ``resume`` names: a new run of the turn they belong to."""
    waiting = thread.interrupts()
    said = answers(resume, waiting)
    turn_by_call = {p["call_id"]: p["turn_id"] for p in thread.pending}
    run_id = str(uuid.uuid4())
    for a in said:
        receipt = await controls.respond(
            api.store, namespace=namespace, turn_id=turn_by_call[a.call], request_id=f"{run_id}:{a.call}",
            call=a.call, decision=a.decision, result=a.result, reason=a.reason, wake_channel=api.wake_channel,
        )  # fmt: skip
        if receipt.status == "rejected":
            raise IllegalTransitionError(f"the answer to interrupt {a.call} was refused: {receipt.reason}")
    turn_id = turn_by_call[said[0].call]
    start = max(
        (e.seq for e in thread.entries if e.turn_id == turn_id
         for f in e.facts if f.get("kind") == "execution.pending"), default=0,
    )  # fmt: skip
    kept = {**kept, "resumed": [a.call for a in said]}
    await api.store.transact(
        lambda conn: api.store.langgraph.add_run(
            conn, run_id, namespace, thread.key, turn_id, kept, start_seq=start
        )
    )
    return await get(api, namespace, thread_id, run_id)


async def _delayed(
    api: Api,
    namespace: str,
    thread_id: str,
    run_id: str,
    agent: Any,
    text: str,
    after: float,
    kept: dict[str, Any],
) -> Run:
    made = await schedule_verbs.create(
        api.store, namespace=namespace, request_id=run_id, session_id=thread_id, agent=agent, text=text,
        delay=after, thread=MAIN_THREAD,
    )  # fmt: skip
    key = thread_key(namespace, thread_id)
    await api.store.transact(
        lambda conn: api.store.langgraph.add_run(
            conn, run_id, namespace, key, None, kept, schedule_id=made["id"]
        )
    )
    return await get(api, namespace, thread_id, run_id)


async def get(api: Api, namespace: str, thread_id: str, run_id: str) -> Run:
    """A run of the thread (a delayed one learns its turn once its schedule fired)."""
    store, key = api.store, thread_key(namespace, thread_id)

    async def work(conn: Connection) -> Any:
        row = await store.langgraph.run(conn, namespace, run_id)
        if row is not None:
            row = await _fired(store, conn, namespace, row)
        else:
            row = next((r for r in await turn_runs(store, conn, key) if r["id"] == run_id), None)
        if row is None or row["session_id"] != key:
            raise NotFoundError(f"thread {thread_id!r} has no run {run_id!r}")
        return row

    return Run.of(namespace, await store.transact(work))


async def _fired(store: BrainStore, conn: Connection, namespace: str, row: Any) -> Any:
    """A delayed run's row with the turn its schedule submitted, once it fired."""
    if row["turn_id"] is not None or row["schedule_id"] is None:
        return row
    schedule = await store.schedules.get(conn, namespace, row["schedule_id"])
    if schedule is None or not schedule["last_turn_id"]:
        return row
    await store.langgraph.set_turn(conn, row["id"], schedule["last_turn_id"])
    return await store.langgraph.run(conn, namespace, row["id"])


async def turn_runs(store: BrainStore, conn: Connection, key: str) -> list[dict[str, Any]]:
    """The runs of the thread's turns that no run row names (a schedule's, a /v1 submit's): each
    the turn, under its request id (as a run's first turn is)."""
    rows = await store.sessions.turns_of(conn, key, key, None, 10_000, 0)
    named = {r["turn_id"] for r in await store.langgraph.runs_of(conn, key)}
    return [
        {"id": t["request_id"], "session_id": key, "turn_id": t["id"], "schedule_id": None, "start_seq": 0,
         "created_at": t["created_at"],
         "body": {"assistant_id": t["agent_name"], "multitask_strategy": "enqueue"}}
        for t in rows if t["id"] not in named
    ]  # fmt: skip


async def runs_of(api: Api, namespace: str, key: str) -> list[Run]:
    """Every run of the thread, the newest first."""
    store = api.store

    async def work(conn: Connection) -> list[Any]:
        rows = [await _fired(store, conn, namespace, r) for r in await store.langgraph.runs_of(conn, key)]
        return [*rows, *await turn_runs(store, conn, key)]

    runs = [Run.of(namespace, r) for r in await store.transact(work)]
    return sorted(runs, key=lambda r: (when(r.created_at) or "", r.run_id), reverse=True)


async def shown(api: Api, runs: list[Run], *, hide_rolled_back: bool = True) -> list[dict[str, Any]]:
    """Runs as LangGraph's clients read them (a rolled-back one is gone, as LangGraph deletes it)."""
    store, turns = api.store, sorted({r.turn_id for r in runs if r.turn_id})

    async def work(conn: Connection) -> tuple[dict[str, Any], list[Any]]:
        return await store.langgraph.turn_states(conn, turns), await store.langgraph.runs_of_turns(
            conn, turns
        )

    states_by_turn, siblings = await store.read(work)
    out = []
    for r in runs:
        turn = states_by_turn.get(r.turn_id or "")
        if turn is not None and turn["rolled_back"] and hide_rolled_back:
            continue
        later = any(s["turn_id"] == r.turn_id and _after(s["created_at"], r.created_at, s["id"], r.run_id)
                    for s in siblings)  # fmt: skip
        status = run_status(turn["status"] if turn else None, waits_for_person=bool(turn and turn["pending"]),
                            resumed_later=later)  # fmt: skip
        out.append({
            "run_id": r.run_id, "thread_id": r.thread_id, "assistant_id": r.body.get("assistant_id"),
            "created_at": when(r.created_at),
            "updated_at": when(turn["updated_at"] if turn else r.created_at),
            "status": status, "metadata": r.body.get("metadata") or {},
            "multitask_strategy": r.body.get("multitask_strategy"), "kwargs": {"stream_mode": r.modes},
        })  # fmt: skip
    return out


def _after(at: Any, than: Any, run_id: str, other: str) -> bool:
    a, b = (datetime.fromisoformat(x) if isinstance(x, str) else x for x in (at, than))
    return bool((a, run_id) > (b, other))
