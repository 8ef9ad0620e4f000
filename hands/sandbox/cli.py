"""``hands sandbox``: list the sandbox bindings of a ledger, request a deletion, reconcile an
UNKNOWN creation. Each needs the backend the pool serves with (``--sandbox`` or
``TENDON_SANDBOX``): a reconcile checks its evidence against it."""

from __future__ import annotations

import argparse
import getpass
import json
from collections.abc import Awaitable, Callable
from typing import Any

from hands.sandbox.chores import reconcile_creation, request_deletion
from hands.sandbox.lifecycle import Lifecycle
from hands.sandbox.serve import lifecycle_for
from hands.sandbox.store import SandboxRow
from infra.db import create_pool
from infra.db.migrate import migrate
from infra.process.settings import Settings
from infra.process.startup import wait_for
from protocol import SchemaError

Command = Callable[[argparse.Namespace, Settings], Awaitable[int]]


def add_commands(sub: Any, migrations: Any) -> None:
    """The ``sandbox`` verbs on the ``hands`` parser; ``migrations``: the ledger's folder."""
    box = sub.add_parser(
        "sandbox",
        help="list, delete or reconcile sandbox bindings",
        description="The sandbox bindings of this ledger (see docs/sandboxes.md).",
    )
    verbs = box.add_subparsers(dest="verb", required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="every binding with its status, identity and error")
    listing.add_argument("--namespace", default=None)
    delete = verbs.add_parser("request-deletion", help="delete a binding's sandbox once its users settled")
    rec = verbs.add_parser("reconcile-creation", help="resolve an UNKNOWN creation with evidence")
    for verb in (delete, rec):
        verb.add_argument("namespace", metavar="NAMESPACE")
        verb.add_argument("binding", metavar="BINDING", help="its id (a session's own: session:SESSION_ID)")
    rec.add_argument(
        "--outcome",
        required=True,
        choices=["created", "absent"],
        help="created: the sandbox under its identity is this binding's; absent: nothing is there",
    )
    rec.add_argument("--evidence", required=True, metavar="TEXT", help="how you know")
    rec.add_argument("--actor", default=None, metavar="NAME", help="who vouches (default: your user name)")
    for verb in (listing, delete, rec):
        verb.add_argument("--sandbox", default=None, metavar="SPEC", help="local:DIRECTORY or docker")
        verb.add_argument("--json", action="store_true", help="print JSON")
        verb.set_defaults(func=lambda args, settings: _run(args, settings, migrations))


async def _run(args: argparse.Namespace, settings: Settings, migrations: Any) -> int:
    spec = args.sandbox or settings.sandbox
    if not spec:
        raise SchemaError("say which sandboxes: --sandbox local:DIRECTORY or docker (or TENDON_SANDBOX)")
    life = lifecycle_for(settings, spec)
    connect = lambda: create_pool(settings.ledger_database_url, settings.hands_schema, max_size=2)  # noqa: E731
    pool = await wait_for(connect, service="PostgreSQL", url=settings.ledger_database_url, patience=0)
    try:
        await migrate(pool, settings.hands_schema, migrations)
        life.attach(pool, "hands-cli")
        rows = await _verb(args, life)
    finally:
        await pool.close()
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
    else:
        for row in rows:
            print(_line(row))
    return 0


async def _verb(args: argparse.Namespace, life: Lifecycle) -> list[SandboxRow]:
    if args.verb == "list":
        return await life.rows.read(lambda conn: life.rows.listing(conn, args.namespace))
    if args.verb == "request-deletion":
        return [await request_deletion(life, args.namespace, args.binding)]
    actor = args.actor or getpass.getuser()
    return [
        await reconcile_creation(
            life, args.namespace, args.binding, args.outcome, evidence=args.evidence, actor=actor
        )
    ]


def _line(row: SandboxRow) -> str:
    said = f" error: {row.error}" if row.error else ""
    vouched = f" (reconciled by {row.actor}: {row.evidence})" if row.evidence else ""
    return (
        f"{row.namespace} {row.binding_id}: {row.status.value.upper()} {row.identity} "
        f"(definition {row.definition} {row.definition_version}, session {row.owner_session}){vouched}{said}"
    )
