"""The ``hands`` command: serve a route's tools, and look at or reconcile ledger rows.

    hands serve --route email --tools examples.email_tools [--concurrency N] [--grace S]
    hands serve --route files --mcp 'stdio:python -m my_server' [--mcp URL] [--mcp-config FILE]
    hands serve --route email --tools myapp.agents   (Pydantic AI / Agents SDK agents' tools)
    hands serve --route box --sandbox local:/var/tmp/tendon-sandboxes   (or --sandbox docker)
    hands show EXECUTION_ID [--json]
    hands sandbox list | request-deletion NS BINDING | reconcile-creation NS BINDING --outcome ...
    hands reconcile EXECUTION_ID (--result JSON | --failed MESSAGE) --evidence TEXT
                    [--actor NAME] [--json]

Settings come from ``TENDON_*`` environment variables, read once here. A Tendon error, or a
service that cannot be reached or refuses (PostgreSQL, RabbitMQ, S3), reaches the user as one
line on stderr and exit code 2; tracebacks are for bugs.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import signal
import sys
from collections.abc import Sequence
from contextlib import AsyncExitStack
from functools import partial
from typing import Any

from hands.app import HandsApp
from hands.run.reconcile import publish, reconcile
from hands.run.relay import stored_events
from hands.sandbox.cli import add_commands as add_sandbox_commands
from hands.store import Execution, Ledger, ledger_for, open_ledger
from hands.tools.mcp_config import server_specs
from infra.db import create_pool
from infra.db.parked import show_parked
from infra.objects.payloads import PayloadCodec, open_payload_codec
from infra.process.cli import ExitCodes, add_parked_command, reported
from infra.process.entry import run_async
from infra.process.heap import settle_heap
from infra.process.killpoints import KillPoints
from infra.process.logging import configure_logging, get_logger
from infra.process.settings import Settings, bad_setting, unknown_variables
from infra.process.startup import wait_for
from infra.transport.broker import Broker, Topology
from protocol import DecodeError, NotFoundError, StaleOwnerError, TransientError, loads

EXIT_ERROR = 2
EXITS = ExitCodes(conflict=EXIT_ERROR, usage=EXIT_ERROR, unavailable=EXIT_ERROR)  # one code for every error
log = get_logger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hands",
        description="Tendon Hands: run a route's tools durably, with a ledger in PostgreSQL. "
        "Configuration comes from TENDON_* environment variables "
        "(TENDON_DATABASE_URL, TENDON_HANDS_DATABASE_URL, TENDON_HANDS_SCHEMA, TENDON_AMQP_URL, "
        "TENDON_S3_ENDPOINT_URL, TENDON_CONCURRENCY, ...).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="serve the tools of one route until SIGTERM/SIGINT",
        description="Load the tools declared for ROUTE, announce their bindings, and execute "
        "commands from the route's queue. It waits for its services at start "
        "(TENDON_SERVICE_WAIT_SECONDS). SIGTERM or SIGINT drains: no new commands, running tools get "
        "--grace seconds to finish, what is still running then is handed back to the pool.",
    )
    serve.add_argument("--route", required=True, help="the route (pool name) to serve, e.g. email")
    serve.add_argument(
        "--tools",
        default=None,
        metavar="MODULE",
        help="where the tools are declared: a module name (examples.email_tools) or a .py file; "
        "its @tool functions and its Pydantic AI / OpenAI Agents SDK agents' tools (docs/framework-tools.md)",
    )
    serve.add_argument(
        "--mcp",
        action="append",
        default=[],
        metavar="SPEC",
        help="serve the tools of an MCP server: 'stdio:COMMAND LINE' or the URL of a Streamable "
        "HTTP server (repeatable)",
    )
    serve.add_argument(
        "--mcp-relist",
        type=float,
        default=None,
        metavar="SECONDS",
        help="list the --mcp servers' tools again this often (at least 1), for servers that do not "
        "say when their tools change",
    )
    serve.add_argument(
        "--mcp-config",
        default=None,
        metavar="FILE",
        help="a JSON file listing MCP servers (commands or URLs, headers from the environment, "
        "replay overrides per tool); see docs/mcp.md",
    )
    serve.add_argument(
        "--sandbox",
        default=None,
        metavar="SPEC",
        help="serve sandbox tools (sandbox_exec, fs_upload, fs_download, artifact_publish) in "
        "'local:DIRECTORY' (no isolation) or 'docker' sandboxes (default: TENDON_SANDBOX); "
        "see docs/sandboxes.md",
    )
    serve.add_argument(
        "--concurrency",
        type=int,
        default=None,
        metavar="N",
        help="how many executions at once, also the prefetch (default: TENDON_CONCURRENCY)",
    )
    serve.add_argument(
        "--grace",
        type=float,
        default=None,
        metavar="SECONDS",
        help="on shutdown, how long running tools may take to finish (default: TENDON_DRAIN_SECONDS)",
    )
    serve.set_defaults(func=_serve)

    show = sub.add_parser(
        "show",
        help="print an execution's ledger row, events and reconciliations",
        description="Print what the ledger knows about one execution.",
    )
    show.add_argument("execution_id", metavar="EXECUTION_ID")
    show.add_argument("--json", action="store_true", help="print one JSON document")
    show.set_defaults(func=_show)

    parked = add_parked_command(
        sub,
        what="this pool",
        surfacing="the pool reads back the commands and controls parked, fails the execution a "
        "parked command concerns (if it never ran) or logs them",
    )
    parked.set_defaults(func=_parked)

    rec = sub.add_parser(
        "reconcile",
        help="resolve an UNKNOWN execution with a result or a failure, plus evidence",
        description="Resolve an UNKNOWN execution after checking the external system by hand. "
        "The resolution is audited (who, when, evidence) and published to the Brain as a "
        "succeeded/failed event with how=reconciled.",
    )
    rec.add_argument("execution_id", metavar="EXECUTION_ID")
    outcome = rec.add_mutually_exclusive_group(required=True)
    outcome.add_argument("--result", metavar="JSON", help="the operation happened; this JSON is its result")
    outcome.add_argument(
        "--failed", metavar="MESSAGE", help="the operation did not happen (or failed); say why"
    )
    rec.add_argument(
        "--evidence",
        required=True,
        metavar="TEXT",
        help="how you know, e.g. 'provider dashboard shows message 123 sent 10:02'",
    )
    rec.add_argument("--actor", default=None, metavar="NAME", help="who vouches (default: your user name)")
    rec.add_argument("--json", action="store_true", help="print one JSON document")
    rec.set_defaults(func=_reconcile)
    add_sandbox_commands(sub, _migrated_pool)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings()
    except ValueError as exc:  # pydantic's ValidationError among them
        print(f"hands: {bad_setting(exc)}", file=sys.stderr)
        return EXIT_ERROR
    for line in unknown_variables(os.environ):
        print(f"hands: warning: {line}", file=sys.stderr)
    configure_logging(settings.log_format, settings.log_level, process="hands")
    return reported("hands", lambda: int(run_async(args.func(args, settings))), EXITS)


# ---- serve ------------------------------------------------------------------------------


async def _serve(args: argparse.Namespace, settings: Settings) -> int:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    while True:
        app = HandsApp(
            settings,
            route=args.route,
            tools=args.tools,
            mcp=server_specs(args.mcp, args.mcp_config, args.mcp_relist),
            kill=KillPoints(settings.kill_at),
            concurrency=args.concurrency,
            grace=args.grace,
            sandbox=args.sandbox or settings.sandbox or None,
        )

        def stop(app: HandsApp = app) -> None:
            stopping.set()
            app.stop()

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: its terminal went away
            loop.add_signal_handler(sig, stop)
        try:
            async with app:
                settle_heap()  # started: what it built lives as long as the process
                await app.serve()
            return 0
        except StaleOwnerError as exc:
            if stopping.is_set():
                return 0
            # Presumed dead by the others (a long pause, or a partition longer than the grace):
            # its work is theirs now. A new worker id starts clean, as a restart would.
            log.warning("starting_over", worker=app.worker_id, reason=exc.message)


# ---- show / reconcile -------------------------------------------------------------------


async def _ledger(stack: AsyncExitStack, settings: Settings) -> Ledger:
    # Not waited for (a user who typed a command learns at once), but named when it is away.
    connect = partial(create_pool, settings.ledger_database_url, settings.hands_schema, max_size=2)
    pool = await wait_for(connect, service="PostgreSQL", url=settings.ledger_database_url, patience=0)
    stack.push_async_callback(pool.close)
    ledger = ledger_for(pool)
    if not await ledger.exists():
        raise NotFoundError(
            f"there is no Hands ledger in schema {settings.hands_schema} "
            "(check TENDON_HANDS_SCHEMA and TENDON_HANDS_DATABASE_URL)"
        )
    return ledger


async def _migrated_pool(stack: AsyncExitStack, settings: Settings) -> Any:
    """The ledger's pool with its migrations applied (the sandbox tables of an older ledger)."""
    ledger = await _ledger(stack, settings)
    await open_ledger(ledger.pool, settings.hands_schema)
    return ledger.pool


async def _codec(stack: AsyncExitStack, settings: Settings) -> PayloadCodec:
    return await stack.enter_async_context(open_payload_codec(settings))


def _event_view(event: dict[str, Any]) -> dict[str, Any]:
    return {
        "seq": event["seq"],
        "kind": event["kind"],
        "body": event.get("body"),
        "body_ref": event.get("body_ref"),
    }


def _audit_view(rec: Any) -> dict[str, Any]:
    return {
        "id": rec["id"],
        "outcome": rec["outcome"],
        "result": rec["result"],
        "error": rec["error"],
        "evidence": rec["evidence"],
        "actor": rec["actor"],
        "request_id": rec["request_id"],
        "at": rec["at"].isoformat(),
        "sent_at": rec["sent_at"].isoformat() if rec["sent_at"] else None,
    }


async def _show(args: argparse.Namespace, settings: Settings) -> int:
    async with AsyncExitStack() as stack:
        ledger = await _ledger(stack, settings)
        async with ledger.pool.acquire() as conn:
            row = await ledger.get(conn, args.execution_id)
            if row is None:
                raise NotFoundError(f"execution {args.execution_id} is not in the ledger")
            events = [_event_view(e) for e in await stored_events(ledger, conn, args.execution_id, 1)]
            audits = [_audit_view(r) for r in await ledger.list_reconciliations(conn, args.execution_id)]
    if args.json:
        print(json.dumps({"execution": row.as_dict(), "events": events, "reconciliations": audits}, indent=2))
        return 0
    print(_describe_row(row))
    print("events:")
    for ev in events:
        content = ev["body"] if ev["body"] is not None else {"body_ref": ev["body_ref"]}
        print(f"  {ev['seq']:>3} {ev['kind']:<12} {json.dumps(content)[:200]}")
    for audit in audits:
        request = f" (request {audit['request_id']})" if audit["request_id"] else ""
        print(
            f"reconciled #{audit['id']}: {audit['outcome'].upper()} by {audit['actor']}{request} at "
            f"{audit['at']}; evidence: {audit['evidence']}"
        )
    return 0


async def _parked(args: argparse.Namespace, settings: Settings) -> int:
    async with AsyncExitStack() as stack:
        ledger = await _ledger(stack, settings)
        return await show_parked(ledger, args.parked_id, limit=args.limit, as_json=args.json)


def _describe_row(row: Execution) -> str:
    lines = [
        f"execution {row.execution_id}: {row.status.value.upper()}",
        f"  route {row.route}, tool {row.tool} (binding {str(row.binding_digest)[:12]}…, "
        f"{row.replay_policy}), attempts {row.attempts}, owner {row.owner}",
        f"  namespace {row.namespace}, session {row.session_id}, turn {row.turn_id}, call {row.call_id}",
        f"  args {json.dumps(row.args)}",
    ]
    if row.result is not None:
        lines.append(f"  result {json.dumps(row.result)[:500]}")
    if row.error is not None:
        lines.append(f"  error {row.error.get('code')}: {row.error.get('message')}")
    lines.append(f"  output {row.output_bytes} bytes, cancel requested: {row.cancel_requested}")
    if row.handle is not None:
        lines.append(f"  handle {row.handle} (re-attached by after a crash)")
    return "\n".join(lines)


def _outcome(args: argparse.Namespace) -> dict[str, Any]:
    """``--result`` (strict JSON: a DecodeError names the option) or ``--failed``."""
    if args.result is None:
        return {"failure": args.failed}
    try:
        return {"result": loads(args.result)}
    except DecodeError as exc:
        raise DecodeError(f"--result is not valid JSON: {exc.message}") from None


async def _reconcile(args: argparse.Namespace, settings: Settings) -> int:
    extra = _outcome(args)
    actor = args.actor or getpass.getuser()
    async with AsyncExitStack() as stack:
        ledger = await _ledger(stack, settings)
        codec = await _codec(stack, settings)
        try:
            done = await reconcile(
                ledger, codec, args.execution_id, evidence=args.evidence, actor=actor, **extra
            )
        except TransientError as exc:
            # The connection may have dropped during COMMIT: the reconcile may be saved or not.
            raise TransientError(
                f"{exc.message}; run `hands show {args.execution_id}` to see whether the "
                "reconcile was saved before trying again"
            ) from exc
        published: int | None
        try:
            broker = await stack.enter_async_context(
                Broker(
                    settings.amqp_url,
                    Topology(settings.queue_prefix),
                    delivery_limit=settings.delivery_limit,
                )
            )
            await publish(ledger, broker, done)
            published = 1
        except Exception as exc:  # committed already: the pool's relay publishes it later
            print(
                f"hands: warning: reconciled, but publishing now failed ({type(exc).__name__}: "
                f"{exc}); the Hands pool will publish the event",
                file=sys.stderr,
            )
            published = None
    outcome = done.execution.status.value
    if args.json:
        print(
            json.dumps(
                {
                    "execution_id": args.execution_id,
                    "status": outcome,
                    "audit_id": done.audit_id,
                    "event_seq": done.seq,
                    "actor": actor,
                    "evidence": args.evidence,
                    "events_published": published,
                }
            )
        )
    else:
        print(
            f"reconciled execution {args.execution_id}: UNKNOWN -> {outcome.upper()} "
            f"(audit #{done.audit_id} by {actor}; event seq {done.seq} {outcome} how=reconciled; "
            f"{published if published is not None else 'no'} event(s) published now)"
        )
    return 0
