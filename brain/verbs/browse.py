"""What the console lists: a namespace's sessions (searched, a page at a time) with their latest
turn, and for operators the UNKNOWN executions of every namespace and the routes with the workers
that serve each right now."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from brain.rules.submits import session_key, shown_session
from brain.store import BrainStore
from brain.verbs.sessions import shown_turn
from infra.db import Connection
from infra.db.store import as_time
from infra.transport import Topology, Transport
from protocol import NotFoundError, SchemaError
from protocol.storable import unstorable

INPUT_SHOWN = 200  # characters of a turn's input a list shows
SESSION_FIELDS = ("id", "created_at", "closed_at", "threads", "turns", "unfinished")


def _cursor(namespace: str, after: str | None) -> tuple[datetime, str] | None:
    """The page cursor a sessions list gave (``next``): the last session's time and id (as the
    store's key of it)."""
    if not after:
        return None
    at, sep, key = after.partition("|")
    try:
        if not sep:
            raise ValueError(after)
        return datetime.fromisoformat(at), session_key(namespace, key)
    except ValueError:
        raise SchemaError(f"after takes the `next` of a page of sessions, not {after!r}") from None


def _shown(text: str | None) -> str | None:
    return text if text is None or len(text) <= INPUT_SHOWN else text[: INPUT_SHOWN - 1] + "…"


async def sessions(
    store: BrainStore, *, namespace: str, search: str | None = None, limit: int = 20, after: str | None = None
) -> dict[str, Any]:
    """A page of ``namespace``'s sessions, newest first, each with its counts and latest turn (its
    status, agent, input and times); ``next`` is the cursor of the page after (None: the last).
    ``search`` keeps those whose id, an agent's name or a request id holds it."""
    for what, text in (("search", search), ("after", after)):
        if unstorable(text) is not None:
            raise SchemaError(f"{what} cannot be looked for: its text {unstorable(text)}")
    before = _cursor(namespace, after)

    async def read(conn: Connection) -> dict[str, Any]:
        rows = await store.sessions.sessions_of(
            conn, namespace, search=search or None, limit=limit, before=before
        )
        latest = [r["last_turn"] for r in rows if r["last_turn"]]
        last = {t["id"]: shown_turn(namespace, t) for t in await store.sessions.turns_by_id(conn, latest)}
        found = []
        for r in rows:
            turn = last.get(r["last_turn"])
            if turn is not None:
                inputs = await store.sessions.inputs(conn, r["id"], [turn["id"]])
                turn["input"] = _shown(inputs.get(turn["id"]))
            shown = {**{k: r[k] for k in SESSION_FIELDS}, "id": shown_session(namespace, r["id"])}
            found.append({**shown, "last_turn": turn})
        more = len(rows) == limit
        cursor = f"{as_time(rows[-1]['created_at']).isoformat()}|{found[-1]['id']}" if more else None
        return {"sessions": found, "next": cursor}

    return await store.read(read)


async def unknown(store: BrainStore, *, limit: int = 100) -> list[dict[str, Any]]:
    """UNKNOWN executions of every namespace, oldest first, each with why it is UNKNOWN (the
    evidence the Hands gave: what they could not tell) and the turn that waits for it."""
    rows = await store.read(lambda conn: store.executions.unknown(conn, limit))
    return [
        {
            **{k: r[k] for k in r.keys() if k != "error"},
            "session_id": shown_session(r["namespace"], r["session_id"]),
            "reason": (r["error"] or {}).get("message"),
        }
        for r in rows
    ]


async def routes(store: BrainStore, transport: Transport, topology: Topology) -> list[dict[str, Any]]:
    """Every route a pool announced tools for, with its tools and how many workers consume its
    commands right now (0: nobody serves it; its calls wait)."""
    rows = await store.read(store.bindings.routes)
    found: dict[str, dict[str, Any]] = {}
    for r in rows:
        route = found.setdefault(r["route"], {"route": r["route"], "tools": [], "announced_at": None})
        route["tools"].append(r["name"])
        at = as_time(r["announced_at"])
        route["announced_at"] = max(route["announced_at"] or at, at)
    for route in found.values():
        route["workers"] = await transport.consumers(topology.commands(route["route"]))
    return list(found.values())


async def output(
    store: BrainStore, *, namespace: str, execution_id: str, offset: int = 0, limit: int = 200
) -> dict[str, Any]:
    """An execution's output pages from byte ``offset`` on (``next``: where to ask from after
    them), its status, and how many bytes its outcome said it wrote once it ended."""
    if unstorable(execution_id) is not None:  # an id no store could hold: there is no such execution
        raise NotFoundError(f"there is no execution {execution_id!r}")
    found = await store.read(
        lambda conn: store.executions.output(conn, namespace, execution_id, offset, limit)
    )
    if found is None:
        raise NotFoundError(f"there is no execution {execution_id!r}")
    row, pages = found
    shown = [{"offset": p["byte_offset"], "data": p["data"]} for p in pages]
    end = shown[-1]["offset"] + len(shown[-1]["data"].encode()) if shown else offset
    return {"execution_id": execution_id, "status": row["status"], "output_bytes": row["output_bytes"],
            "pages": shown, "next": end}  # fmt: skip
