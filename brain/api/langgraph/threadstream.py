"""A thread's stream (``GET /threads/{id}/stream``, the SDK's ``threads.join_stream``): every run of
the thread as it happens, read from the session's journal like a run's stream (``runstream``).

It never ends by itself: it follows the runs made after it opened too, until the client closes it
(invariant 13: closing it changes nothing). Without ``Last-Event-ID`` it starts at the first entry
of the oldest unfinished run (the whole of a run in progress), or at the journal's end when the
thread is idle. Each part's id is ``SEQ-K`` as on a run's stream, so a reconnect with the last id
gets every later part once. A part of a run names the run that made its turn (the turn's request
id: a LangGraph run's id, or a /v1 submit's); the parts of one entry depend only on the entry and
the stream's mode, never on when the stream read it.

- ``run_modes`` (the default): a ``metadata`` part when a run starts, then its parts in the
  ``values``, ``updates``, ``messages-tuple`` and ``custom`` modes (the modes of a run made after
  the stream opened cannot be known when it reads it), an interrupt and an end as a run's stream
  says them;
- ``lifecycle``: ``metadata`` parts only, ``{"run_id", "status"}``: ``running`` when a run starts,
  ``interrupted`` when it waits for a person, ``success``/``error``/``cancelled`` at its end;
- ``state_update``: ``values`` after every entry that changed the thread's conversation (a run's,
  a rewind's, a copy's first).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from sse_starlette.sse import EventSourceResponse

from brain.api.app import Api
from brain.api.guard import CheckedRoute
from brain.api.langgraph import runstream
from brain.api.langgraph.common import CallerDep, NotSupported, api_of
from brain.api.langgraph.messages import ENDS, Conversation, Parts
from brain.api.langgraph.state import Thread
from brain.api.langgraph.threads import found
from brain.rules.records import Entry
from brain.rules.submits import shown_session

router = APIRouter(prefix="/langgraph", tags=["langgraph"], route_class=CheckedRoute)
THREAD_MODES = ("run_modes", "lifecycle", "state_update")
THREAD_DEFAULT = ["run_modes"]
RUN_MODES = ("values", "updates", "messages-tuple", "custom")
_LIFECYCLE = {"turn.completed": "success", "turn.failed": "error", "turn.cancelled": "cancelled"}


def start_of(t: Thread) -> int:
    """Where a stream with no ``Last-Event-ID`` starts: before the oldest unfinished turn's first
    entry, else after the journal's last."""
    ended = {e.turn_id for e in t.entries for f in e.facts if f.get("kind") in ENDS}
    open_seqs = [e.seq for e in t.entries if e.turn_id and e.turn_id not in ended]
    return min(open_seqs) - 1 if open_seqs else max((e.seq for e in t.entries), default=0)


def thread_parts(
    modes: list[str], entry: Entry, new: list[dict[str, Any]], convo: Conversation, run_id: str, shown: str
) -> list[tuple[str, Any]]:
    """One entry's parts on a thread's stream (``run_id``: the run of its turn): a run's start, its
    parts, its end or interrupt, in that order."""
    runs = entry.turn_id is not None and "run_modes" in modes
    out: list[tuple[str, Any]] = []
    if entry.turn_id is not None and any(f.get("kind") == "turn.accepted" for f in entry.facts):
        if "lifecycle" in modes:
            out.append(("metadata", {"run_id": run_id, "status": "running"}))
        if runs:
            out.append(("metadata", {"run_id": run_id, "attempt": 1}))
    if "state_update" in modes and new and not runs:  # run_modes sends the values itself
        out.append(("values", convo.values()))
    if runs:
        out += runstream.parts_of(Parts(RUN_MODES, run_id, shown), entry, new, convo)[0]
    if "lifecycle" in modes and entry.turn_id is not None:
        end = next((_LIFECYCLE[f["kind"]] for f in entry.facts if f.get("kind") in _LIFECYCLE), None)
        if end is None and any(f.get("kind") == "execution.pending" for f in entry.facts):
            end = "interrupted"
        if end is not None:
            out.append(("metadata", {"run_id": run_id, "status": end}))
    return out


async def follow(
    api: Api, namespace: str, t: Thread, modes: list[str], seen: tuple[int, int] | None
) -> AsyncIterator[dict[str, Any]]:
    """The thread's parts after ``seen`` (after ``start_of`` when None), for as long as it is read."""
    after = seen if seen is not None else (start_of(t), 1 << 31)
    convo, position, shown = Conversation(t.key), 0, shown_session(namespace, t.key)
    requests: dict[str, str] = {}  # turn id -> its request id: the run that made it
    while True:
        entries, executions = await runstream.entries_after(api, t.key, position)
        for e in entries:
            position = e.seq
            new = convo.add(e, executions)
            if e.thread_id not in (None, t.key):
                continue  # another thread of the session (a /v1 fork): not the LangGraph thread's
            for f in e.facts:
                if f.get("kind") == "turn.accepted" and e.turn_id:
                    requests[e.turn_id] = str(f.get("request_id") or e.turn_id)
            run_id = requests.get(e.turn_id or "", e.turn_id or "")
            for k, (event, data) in enumerate(thread_parts(modes, e, new, convo, run_id, shown)):
                if (e.seq, k) > after:
                    yield {"event": event, "data": json.dumps(data, default=str), "id": f"{e.seq}-{k}"}
        if len(entries) < runstream.PAGE:
            await asyncio.sleep(api.poll)  # the native stream's look at the journal, as often


@router.get("/threads/{thread_id}/stream")
async def stream(
    thread_id: str,
    request: Request,
    caller: CallerDep,
    stream_mode: Annotated[
        list[str], Query(description="run_modes, lifecycle, state_update")
    ] = THREAD_DEFAULT,
) -> EventSourceResponse:
    """Every run of the thread as it happens (``threads.join_stream``); resumable by Last-Event-ID."""
    for mode in stream_mode:
        if mode not in THREAD_MODES:
            raise NotSupported(f"thread stream mode {mode[:40]!r}: Tendon streams {', '.join(THREAD_MODES)}")
    seen = runstream.last_seen(request.headers.get("last-event-id"))
    api, namespace = api_of(request), caller.tenant()
    t = await found(api.store, namespace, thread_id)
    return EventSourceResponse(follow(api, namespace, t, stream_mode, seen), ping=15)
