"""PostgreSQL's side of the boundary: the pool every Brain and Hands process opens, what each of its
sessions sets on the server, and the names a schema's advisory locks and dialect go by."""

from __future__ import annotations

import hashlib
import json
import zlib
from typing import Any

import asyncpg

from infra.db.values import encode_json


async def init_connection(conn: asyncpg.Connection) -> None:
    """What every Tendon connection speaks: JSON for json and jsonb, through the one codec."""
    for typename in ("json", "jsonb"):
        await conn.set_type_codec(
            typename,
            encoder=encode_json,
            decoder=json.loads,
            schema="pg_catalog",
        )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool connections carry no session state (no LISTEN, SET or session locks): asyncpg
    still rolls back an open transaction on release, so the reset query's round trip on
    every release is skipped."""


# No Tendon transaction waits on anything but its own statements (model calls and tool bodies run
# outside them), so one left idle this long belongs to a process that stopped (SIGSTOP, a frozen
# VM) between two of its statements: the server ends that session, and the row locks it held no
# longer keep the others from declaring it dead and taking its work over (invariant 10). A
# process that was only slow finds its connection gone: a passing fault, ridden out.
IDLE_IN_TRANSACTION = 10.0  # seconds


def session_settings(schema: str, idle_in_transaction: float = IDLE_IN_TRANSACTION) -> dict[str, str]:
    """What every session that runs Tendon's transactions (the pools, the liveness connection)
    sets on the server: its schema, and how long it may leave a transaction idle."""
    return {
        "search_path": schema,
        "idle_in_transaction_session_timeout": str(max(1, round(idle_in_transaction * 1000))),
    }


# PostgreSQL keeps this many bytes of an application_name (NAMEDATALEN - 1) and cuts the rest.
APPLICATION_NAME_BYTES = 63
SESSION_PREFIX = "tendon:"


def session_name(worker_id: str) -> str:
    """The ``application_name`` of every session a worker opens (its pools, its liveness, its
    listener), so that the others can end them all when they presume it dead: a process frozen
    mid-statement keeps its row locks, and no timeout of the server's ends such a session. Worker
    ids fit (``infra.liveness.new_worker_id``); a longer one is cut and told apart by a digest."""
    name = SESSION_PREFIX + worker_id
    if len(name.encode()) <= APPLICATION_NAME_BYTES and name.isascii():
        return name
    tail = "~" + hashlib.sha256(worker_id.encode()).hexdigest()[:12]
    head = name.encode("ascii", "replace")[: APPLICATION_NAME_BYTES - len(tail)].decode()
    return head + tail


async def create_pool(
    dsn: str, schema: str, *, min_size: int = 1, max_size: int = 10, name: str | None = None
) -> asyncpg.Pool:
    """A pool whose connections work inside ``schema`` and speak JSON for json/jsonb. ``name``:
    their ``application_name`` (a worker's :func:`session_name`; a command's pool has none)."""
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=init_connection,
        reset=_keep_session,
        server_settings={
            **session_settings(schema),
            "application_name": name or f"{SESSION_PREFIX}{schema}",
            # Tendon's statements are prepared once per connection and run with arrays and ids
            # whose values do not change the best plan: planning each execution anew (what
            # PostgreSQL does for a statement's first five runs, and often after) is wasted.
            "plan_cache_mode": "force_generic_plan",
            # The rows Tendon's statements touch are the hot ones, in memory: an index probe costs
            # about a page read in order, not four (PostgreSQL's default, made for disks; 1.1 is
            # what its manual suggests for such storage). With the default, a statement that looks
            # up a few rows by key read whole tables of a few hundred rows instead.
            "random_page_cost": "1.1",
        },
    )
    assert pool is not None
    return pool


def lock_class(schema: str) -> int:
    """A stable positive int32 for advisory locks that belong to ``schema``."""
    return zlib.crc32(schema.encode()) & 0x7FFFFFFF


def dialect(pool: Any) -> str:
    """``postgres`` for an asyncpg pool or connection, ``sqlite`` for infra.db.sqlite's. For the
    stores and this module only: everything above them asks a store for what it can do."""
    return str(getattr(pool, "dialect", "postgres"))
