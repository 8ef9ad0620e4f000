"""Parked messages: whatever a dead-letter queue holds is read, recorded and surfaced.

A message lands in a queue's dead-letter queue when it can never be processed as it is: not
decodable, a conflict, a reference that fails verification, or delivered more times than the
delivery limit allows (a message that broke its consumer again and again). Each component
consumes the dead-letter queues of the queues it consumes (the Brain: updates and bindings; a
Hands pool: its route's commands and controls), so that nothing parked goes unnoticed:

- it is surfaced where it belongs: an error on the turn or execution it names, which the
  component decides (its ``Surface``); a message that names nothing is logged with its reason;
- it is recorded in the ``parked`` table of the component's schema (reason, headers, bytes and
  what was done about it), for ``brain parked`` and ``hands parked`` to list and show.

Each schema that uses this has the ``parked`` table (created by the component's migrations), and
each component's store includes :class:`ParkedRows`, the statements on it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from typing import Any

from infra.db import Connection, is_transient, patiently
from infra.process.logging import get_logger
from infra.transport import REASON_HEADER, Delivery, Topology, Transport
from protocol import NotFoundError, ProtocolError, TendonError, decode
from protocol.storable import storable

log = get_logger(__name__)

# What a component does about a parked message that it could decode, in the caller's
# transaction; returns what it did (one sentence), or None when it had nothing to do.
Surface = Callable[[Any, Any, str], Awaitable[str | None]]

_DEATHS = {
    "delivery_limit": "delivered more times than the delivery limit allows without being settled",
    "rejected": "rejected by its consumer",
    "expired": "expired in its queue",
    "maxlen": "dropped by a full queue",
}


def reason_of(headers: dict[str, Any] | None) -> str:
    """Why a message was parked, from its headers: Tendon's own reason, or the broker's."""
    headers = {
        k: v.decode(errors="replace") if isinstance(v, bytes) else v for k, v in (headers or {}).items()
    }
    if headers.get(REASON_HEADER):
        return str(headers[REASON_HEADER])
    death = str(headers.get("x-first-death-reason") or "")
    if death:
        where = headers.get("x-first-death-queue")
        return _DEATHS.get(death, death) + (f" (queue {where})" if where else "")
    return "no reason given"


class ParkedConsumer:
    """Consumes the dead-letter queue of ``queue``: surfaces and records each message."""

    def __init__(self, store: Any, transport: Transport, queue: str, surface: Surface | None = None) -> None:
        self.store = store  # a component's store: it has ParkedRows
        self.transport = transport
        self.queue = queue
        self.dlq = Topology.dlq(queue)
        self._surface = surface

    async def start(self, *, prefetch: int = 4) -> Any:
        return await self.transport.consume(self.dlq, self.handle, prefetch=prefetch)

    async def handle(self, message: Delivery) -> None:
        """Never raises and never hands the message back (a dead-letter queue has no limit
        that would park it again): a fault that does not pass is logged, and it is dropped."""
        reason = reason_of(message.headers)
        try:
            envelope = decode(message.body)
        except ProtocolError:
            envelope = None
        try:
            surfaced = await patiently(lambda: self._surfaced(envelope, reason), what="a parked message")
            await patiently(
                lambda: self.store.transact(lambda c: self._record(c, message, reason, envelope, surfaced)),
                what="a parked message",
            )
        except Exception:
            log.exception("parked_message_not_recorded", queue=self.queue, reason=reason)
        else:
            log.warning(
                "message_parked",
                queue=self.queue,
                message_id=message.message_id,
                kind=getattr(envelope, "kind", None),
                execution_id=getattr(envelope, "execution_id", None),
                reason=reason,
                surfaced=surfaced,
            )
        try:
            await message.ack()
        except Exception as exc:  # noqa: BLE001 - then it comes again, and is recorded again
            log.warning("parked_ack_failed", queue=self.queue, error=repr(exc))

    async def _surfaced(self, envelope: Any, reason: str) -> str:
        if envelope is None or self._surface is None:
            return "logged: it names nothing that can be told"
        surface = self._surface
        try:
            done = await self.store.transact(lambda conn: surface(conn, envelope, reason))
        except Exception as exc:
            if is_transient(exc):
                raise
            detail = exc.message if isinstance(exc, TendonError) else f"{type(exc).__name__}: {exc}"
            return storable(f"logged: telling {getattr(envelope, 'execution_id', '?')} failed: {detail}")
        return done or "logged: nothing was left to tell"

    async def _record(
        self, conn: Connection, message: Delivery, reason: str, envelope: Any, surfaced: str
    ) -> None:
        headers = {storable(str(k)): storable(str(v)) for k, v in (message.headers or {}).items()}
        named = getattr(envelope, "execution_id", None) or _first_execution(envelope)
        await self.store.record_parked(
            conn,
            queue=self.queue,
            message_id=storable(message.message_id) if message.message_id else None,
            reason=storable(reason),
            headers=headers,
            body=bytes(message.body),
            kind=getattr(envelope, "kind", None),
            execution_id=storable(named) if named else None,
            surfaced=surfaced,
        )


def _first_execution(envelope: Any) -> str | None:
    """The execution a batch of events or commands names first (a parked batch is listed under
    it)."""
    carried = getattr(envelope, "events", None) or getattr(envelope, "commands", None)
    return carried[0].execution_id if carried else None


class ParkedRows:
    """The statements on a component's ``parked`` table; mixed into its store."""

    async def record_parked(self, conn: Connection, **row: Any) -> None:
        await conn.execute(
            """INSERT INTO parked (queue, message_id, reason, headers, body, kind, execution_id, surfaced)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8)""",
            row["queue"],
            row["message_id"],
            row["reason"],
            row["headers"],
            row["body"],
            row["kind"],
            row["execution_id"],
            row["surfaced"],
        )

    async def parked_listing(self, conn: Connection, limit: int) -> list[Any]:
        return list(
            await conn.fetch(
                """SELECT id, parked_at, queue, message_id, kind, execution_id, reason, surfaced
                     FROM parked ORDER BY id DESC LIMIT $1""",
                limit,
            )
        )

    async def parked_one(self, conn: Connection, parked_id: int) -> Any:
        return await conn.fetchrow("SELECT * FROM parked WHERE id = $1", parked_id)

    async def prune_parked(self, conn: Connection, horizon_seconds: float, limit: int) -> int:
        """Delete up to ``limit`` parked messages recorded ``horizon_seconds`` ago or more (what
        they did to their turn or execution was done when they were recorded)."""
        gone = await conn.fetch(
            """DELETE FROM parked WHERE id IN (
                   SELECT id FROM parked WHERE parked_at < ts_add(now(), $1) ORDER BY id LIMIT $2)
               RETURNING id""",
            -horizon_seconds,
            limit,
        )
        return len(gone)


# ---- reading them back (the `parked` commands) --------------------------------------------


async def listing(store: Any, limit: int = 50) -> list[dict[str, Any]]:
    """The latest parked messages, newest first, without their bodies."""
    rows = await store.read(lambda c: store.parked_listing(c, limit))
    return [{**dict(r), "parked_at": r["parked_at"].isoformat()} for r in rows]


async def one(store: Any, parked_id: int) -> dict[str, Any] | None:
    """One parked message with its headers and body (as text when it is UTF-8)."""
    row = await store.read(lambda c: store.parked_one(c, parked_id))
    if row is None:
        return None
    body = bytes(row["body"])
    try:
        text: str | None = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {
        **{k: row[k] for k in ("id", "queue", "message_id", "kind", "execution_id", "reason", "surfaced")},
        "headers": row["headers"],
        "parked_at": row["parked_at"].isoformat(),
        "body": text if text is not None else body.hex(),
        "body_encoding": "utf-8" if text is not None else "hex",
    }


def add_parked_command(subparsers: Any, *, what: str, surfacing: str) -> argparse.ArgumentParser:
    """The ``parked`` command of a CLI (``brain``, ``hands``): the same arguments for both."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "parked",
        help=f"list the messages the broker parked for {what}, or show one",
        description=f"Messages that could never be processed are parked by the broker; {surfacing}, "
        "and keeps them here. Without an id: the latest, newest first.",
    )
    parser.add_argument("parked_id", nargs="?", type=int, metavar="ID", help="show this one, with its body")
    parser.add_argument("--limit", type=int, default=50, help="how many to list (default 50)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


async def show_parked(store: Any, parked_id: int | None, *, limit: int, as_json: bool) -> int:
    """What ``brain parked`` and ``hands parked`` print; raises NotFoundError for an unknown id."""
    if parked_id is None:
        rows = await listing(store, limit)
        print(json.dumps(rows, indent=2, default=str) if as_json else render_listing(rows))
        return 0
    row = await one(store, parked_id)
    if row is None:
        raise NotFoundError(f"no parked message #{parked_id}")
    print(json.dumps(row, indent=2, default=str) if as_json else render_one(row))
    return 0


def render_listing(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "nothing parked"
    lines = []
    for r in rows:
        names = " ".join(filter(None, [r["kind"], r["execution_id"]])) or "undecodable"
        lines.append(f"#{r['id']}  {r['parked_at'][:19]}  {r['queue']}  {names}")
        lines.append(f"      reason: {r['reason'][:300]}")
        lines.append(f"      {r['surfaced']}")
    return "\n".join(lines)


def render_one(row: dict[str, Any]) -> str:
    lines = [
        f"parked message #{row['id']} from {row['queue']} at {row['parked_at']}",
        f"  message id: {row['message_id']}",
        f"  kind: {row['kind'] or 'undecodable'}, execution: {row['execution_id'] or '-'}",
        f"  reason: {row['reason']}",
        f"  {row['surfaced']}",
        "  headers: " + json.dumps(row["headers"], sort_keys=True),
        f"  body ({row['body_encoding']}):",
        "    " + row["body"][:4000].replace("\n", "\n    "),
    ]
    return "\n".join(lines)
