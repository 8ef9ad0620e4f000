"""Following a run: its stream parts as Server-Sent Events, and a join that waits for its end.

The stream reads the session's journal from its start (the conversation before the run is part
of its ``values``) and sends the parts of the run's own entries (``messages``). Each part's id is
``SEQ-K``: the K-th part of journal entry SEQ, the same whichever Brain serves it, so a client that
reconnects with ``Last-Event-ID`` gets every later part once and none twice. A stream ends where
the run does: its turn's end, or a call that waits for a person (an interrupt). Closing it changes
nothing of the work (invariant 13), unless the run asked for ``on_disconnect=cancel`` (or the
join ``cancel_on_disconnect``): an explicit cancel, sent when the client goes away.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from brain.api.app import Api
from brain.api.langgraph import cancels, runflow
from brain.api.langgraph.messages import ENDS, Conversation, Parts, call_args, interrupts
from brain.api.langgraph.threads import found
from brain.rules.history import needed_executions
from brain.run.endings import wake_or_timeout
from brain.store import Entry
from brain.verbs.describe import describe
from protocol import SchemaError

PAGE = 500
_CANCELS: set[asyncio.Task[None]] = set()  # cancels sent for clients that went away, kept till done


def last_seen(value: str | None) -> tuple[int, int] | None:
    """``Last-Event-ID`` as (entry seq, part): ``SEQ-K``, or a plain ``SEQ`` (all of that entry)."""
    text = (value or "").strip(" \t")  # not str.strip(): it takes NEL (\x85) for a space too
    if not text:
        return None
    found_id = re.fullmatch(r"([0-9]{1,18})(?:-([0-9]{1,9}))?", text)
    if found_id is None:
        raise SchemaError(f"Last-Event-ID is a part id of this run (SEQ-K), not {text[:40]!r}")
    return int(found_id[1]), int(found_id[2]) if found_id[2] is not None else 1 << 31


def parts_of(
    parts: Parts, entry: Entry, new: list[dict[str, Any]], convo: Conversation
) -> tuple[list[tuple[str, Any]], bool]:
    """One entry's parts, and whether the run stops after it."""
    said = parts.of(entry, new, convo)
    end = next((f for f in entry.facts if f.get("kind") in ENDS), None)
    if end is not None:
        return said + parts.ended(end, convo), True
    pending = [f for f in entry.facts if f.get("kind") == "execution.pending"]
    if pending:
        return said + parts.interrupted(convo, interrupts(pending, call_args(convo.messages()))), True
    return said, False


async def entries_after(api: Api, key: str, after: int) -> tuple[list[Entry], dict[str, Any]]:
    store = api.store

    async def work(conn: Any) -> tuple[list[Entry], dict[str, Any]]:
        entries = await store.journal.entries(conn, key, after=after, limit=PAGE)
        needed = needed_executions(entries)
        return entries, (await store.executions.executions_by_id(conn, needed) if needed else {})

    return await store.read(work)


async def follow(
    request: Request, api: Api, namespace: str, run: runflow.Run, modes: list[str],
    seen: tuple[int, int] | None,
    *, cancel_on_disconnect: bool,
) -> AsyncIterator[dict[str, Any]]:  # fmt: skip
    """The run's parts from after ``seen`` (all of them, after a ``metadata`` part, when None)."""
    if seen is None:
        yield {"event": "metadata", "data": json.dumps({"run_id": run.run_id, "attempt": 1})}
    convo, parts, position, done = Conversation(run.key), Parts(modes, run.run_id, run.thread_id), 0, False
    try:
        while not done:
            if run.turn_id is None:  # a delayed run whose schedule has not fired yet
                await asyncio.sleep(api.poll)
                run = await runflow.get(api, namespace, run.thread_id, run.run_id)
                continue
            entries, executions = await entries_after(api, run.key, position)
            for e in entries:
                position = e.seq
                new = convo.add(e, executions)
                if e.turn_id != run.turn_id or e.seq <= run.start_seq:
                    continue
                said, done = parts_of(parts, e, new, convo)
                for k, (event, data) in enumerate(said):
                    if seen is None or (e.seq, k) > seen:
                        yield {"event": event, "data": json.dumps(data, default=str), "id": f"{e.seq}-{k}"}
                if done:
                    break
            if not done and len(entries) < PAGE:
                with api.endings.watch(run.turn_id) as ended:
                    await wake_or_timeout(ended, api.poll)
    finally:
        if not done and cancel_on_disconnect:
            task = asyncio.create_task(cancels.cancel(api, namespace, run, "interrupt"))
            _CANCELS.add(task)
            task.add_done_callback(_CANCELS.discard)


async def join(api: Api, namespace: str, run: runflow.Run, request: Request | None = None) -> dict[str, Any]:
    """Wait for the run's end (or its interrupt); the thread's values then, with ``__interrupt__``
    (what waits for a person) or ``__error__`` (why it failed) as LangGraph says them."""
    while True:
        (view,) = await runflow.shown(api, [run], hide_rolled_back=False)
        if view["status"] not in ("pending", "running"):
            break
        if (
            request is not None
            and run.body.get("on_disconnect") == "cancel"
            and await request.is_disconnected()
        ):
            await cancels.cancel(api, namespace, run, "interrupt")
            continue
        if run.turn_id is None:
            await asyncio.sleep(api.wait_poll)
            run = await runflow.get(api, namespace, run.thread_id, run.run_id)
            continue
        with api.endings.watch(run.turn_id) as ended:
            await wake_or_timeout(ended, api.wait_poll)
    thread = await found(api.store, namespace, run.thread_id)
    values: dict[str, Any] = thread.conversation().values()
    if view["status"] == "error" and run.turn_id is not None:
        error = (await describe(api.store, namespace, run.turn_id)).get("error") or {}
        values["__error__"] = {"error": error.get("code", "error"), "message": error.get("message", "")}
    waiting = thread.interrupts()
    if waiting:
        values["__interrupt__"] = waiting
    return values
