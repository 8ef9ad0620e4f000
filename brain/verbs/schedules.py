"""Schedules: submit a turn into a thread on a cron expression, or once after a delay; list them,
pause, resume and delete them. One place for `brain schedule` and ``/v1/schedules``.

Creating one is idempotent by its request id (per namespace): the same request id with the same
input answers the schedule made the first time; with another input it is a CONFLICT. The Brains
fire them (``brain.run.schedules``); each time fires once, in the commit that accepts its turn.
"""

from __future__ import annotations

from typing import Any

from brain.rules import schedules as rules
from brain.rules.agents import AgentDefinition
from brain.rules.names import MAX_REQUEST_ID, MAX_SESSION_ID, check_id
from brain.rules.submits import MAIN_THREAD
from brain.store import BrainStore
from brain.verbs.sessions import check_thread_name
from infra.db import Connection
from protocol import ConflictError, NotFoundError, SchemaError, digest, new_timed_id
from protocol.storable import unstorable

MAX_LIST = 1000


def view(row: Any) -> dict[str, Any]:
    """A schedule as its callers see it."""
    r = dict(row)
    agent = r.pop("agent")
    for key in ("input_digest", "namespace", "now"):
        r.pop(key, None)
    for key in ("next_at", "last_due_at", "last_fired_at", "created_at"):
        r[key] = r[key].isoformat() if r[key] is not None and hasattr(r[key], "isoformat") else r[key]
    state = "paused" if r["paused"] else ("done" if r["next_at"] is None else "active")
    return {**r, "paused": bool(r["paused"]), "state": state, "agent": f"{agent['name']}@{agent['version']}"}


async def create(
    store: BrainStore,
    *,
    namespace: str,
    request_id: str,
    session_id: str,
    agent: AgentDefinition,
    text: str,
    cron: str | None = None,
    delay: float | None = None,
    thread: str = MAIN_THREAD,
) -> dict[str, Any]:
    """A new schedule (or the one this request id made before)."""
    rules.check(cron, delay)
    check_thread_name(thread)
    check_id("request id", request_id, MAX_REQUEST_ID)
    check_id("session id", session_id, MAX_SESSION_ID)
    for what, problem in (("the input", unstorable(text)), (f"agent {agent.name}", agent.unstorable)):
        if problem is not None:
            raise SchemaError(f"{what} cannot be stored: its text {problem}")
    stored = agent.model_dump(mode="json")
    input_digest = digest({"session": session_id, "thread": thread, "agent": stored, "input": text,
                           "cron": cron, "delay": delay})  # fmt: skip

    async def work(conn: Connection) -> Any:
        earlier = await store.schedules.by_request(conn, namespace, request_id)
        if earlier is not None:
            if earlier["input_digest"] != input_digest:
                used = f"request id {request_id!r} was already used for schedule {earlier['id']}"
                raise ConflictError(used)
            return earlier
        first = rules.first_time(cron, delay, await store.schedules.now(conn))
        return await store.schedules.add(
            conn, f"sch-{new_timed_id()}", namespace, request_id, input_digest, session_id, thread, stored,
            text, cron, first,
        )  # fmt: skip

    return view(await store.transact(work, read_then_insert=True))


async def listed(store: BrainStore, *, namespace: str, limit: int = MAX_LIST) -> list[dict[str, Any]]:
    """The namespace's schedules, oldest first."""
    rows = await store.read(lambda conn: store.schedules.listed(conn, namespace, min(limit, MAX_LIST)))
    return [view(r) for r in rows]


async def change(store: BrainStore, *, namespace: str, schedule_id: str, action: str) -> dict[str, Any]:
    """``pause``, ``resume`` or ``delete`` a schedule; the schedule as it stands after (its id and
    ``"state": "deleted"`` once deleted). A paused schedule does not fire; resumed, it fires at its
    next time from now on (a time that passed while it was paused fires once, late, as a missed one
    does)."""
    if action not in ("pause", "resume", "delete"):
        raise SchemaError(f"a schedule is paused, resumed or deleted, not {action!r}")

    async def work(conn: Connection) -> Any:
        row = await store.schedules.get(conn, namespace, schedule_id, lock=True)
        if row is None:
            raise NotFoundError(f"there is no schedule {schedule_id!r}")
        if action == "delete":
            await store.schedules.delete(conn, schedule_id)
            return None
        await store.schedules.set_paused(conn, schedule_id, action == "pause")
        return await store.schedules.get(conn, namespace, schedule_id)

    row = await store.transact(work)
    return {"id": schedule_id, "state": "deleted"} if row is None else view(row)
