"""``hands sandbox``: list the sandbox bindings of a ledger, request a deletion, reconcile an
UNKNOWN creation. A reconcile needs the backend the pool serves with (``--sandbox`` or
``TENDON_SANDBOX``): it checks its evidence against it."""

from __future__ import annotations

import argparse
import getpass
import json
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

from hands.sandbox.chores import reconcile_creation, request_deletion
from hands.sandbox.serve import lifecycle_for
from hands.sandbox.store import SandboxRow, rows_for
from infra.process.settings import Settings
from protocol import SchemaError

OpenPool = Callable[[AsyncExitStack, Settings], Awaitable[Any]]


def add_commands(sub: Any, open_pool: OpenPool) -> None:
    """The ``sandbox`` verbs on the ``hands`` parser; ``open_pool``: the ledger's pool, checked
    and migrated, closed with the stack it is given."""
    box = sub.add_parser(
        "sandbox",
        help="list, delete or reconcile sandbox bindings",
        description="The sandbox bindings of this ledger (see docs/sandboxes.md).",
    )
    verbs = box.add_subparsers(dest="verb", required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="every binding with its status, identity and error")
    listing.add_argument("--namespace", default=None)
    delete = verbs.add_parser(
        "request-deletion",
        help="delete a binding's sandbox once its users settled",
        description="Mark the binding DELETING: it takes no new call; a worker of a sandbox pool then "
        "waits for the executions using it, deletes the sandbox (container and volume, or directory) "
        "and marks it DELETED (`hands sandbox list`).",
    )
    rec = verbs.add_parser(
        "reconcile-creation",
        help="resolve an UNKNOWN creation with evidence",
        description="A creation whose outcome was lost is UNKNOWN: say what the provider shows (--outcome), "
        "with --evidence; the provider is checked first (--sandbox).",
    )
    for verb in (delete, rec):
        verb.add_argument("namespace", metavar="NAMESPACE", help="the binding's namespace, as list shows it")
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
        verb.add_argument(
            "--sandbox", default=None, metavar="SPEC", help="local:DIRECTORY or docker (a reconcile needs it)"
        )
        verb.add_argument("--json", action="store_true", help="print JSON")
        verb.set_defaults(func=lambda args, settings: _run(args, settings, open_pool))


async def _run(args: argparse.Namespace, settings: Settings, open_pool: OpenPool) -> int:
    spec = args.sandbox or settings.sandbox
    if args.verb == "reconcile-creation" and not spec:
        raise SchemaError("a reconcile checks the provider: give --sandbox local:DIRECTORY or docker")
    async with AsyncExitStack() as stack:
        rows = await _verb(args, settings, spec, await open_pool(stack, settings))
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
    else:
        for row in rows:
            print(_line(row))
    return 0


async def _verb(args: argparse.Namespace, settings: Settings, spec: str, pool: Any) -> list[SandboxRow]:
    rows = rows_for(pool)
    if args.verb == "list":
        return await rows.read(lambda conn: rows.listing(conn, args.namespace))
    if args.verb == "request-deletion":
        return [await request_deletion(rows, args.namespace, args.binding)]
    life = lifecycle_for(settings, spec)
    life.attach(pool, "hands-cli")
    actor = args.actor or getpass.getuser()
    done = await reconcile_creation(
        life, args.namespace, args.binding, args.outcome, evidence=args.evidence, actor=actor
    )
    return [done]


def _line(row: SandboxRow) -> str:
    said = f" error: {row.error}" if row.error else ""
    vouched = f" (reconciled by {row.actor}: {row.evidence})" if row.evidence else ""
    return (
        f"{row.namespace} {row.binding_id}: {row.status.value.upper()} {row.identity} "
        f"(definition {row.definition} {row.definition_version}, session {row.owner_session}){vouched}{said}"
    )
