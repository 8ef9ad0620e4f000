"""`brain schedule`: make, list, pause, resume and delete schedules (``brain.verbs.schedules``),
on the Brain's database or through a Brain's HTTP API (``--url`` / ``TENDON_URL``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from brain.face.access import Direct, Remote, access
from brain.rules.agents import AgentDefinition
from brain.verbs import schedules
from infra.process.settings import Settings
from protocol import new_id


def add_parser(sub: argparse._SubParsersAction, remote: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    s = sub.add_parser(
        "schedule", help="submit a turn on a cron expression or once after a delay; list, pause, delete"
    )
    actions = s.add_subparsers(dest="action", required=True)
    add = actions.add_parser(
        "add", parents=[remote], help="a new schedule (prints it)",
        description="Submit a turn into a session's thread on a cron expression (five fields, or six with "
        "the seconds last; UTC) or once after a delay. Each time fires once, however many Brains run; a "
        "time missed while none ran fires once, late, and its turn's accepted fact says so.",
    )  # fmt: skip
    add.add_argument("--session", required=True)
    add.add_argument("--thread", default="main")
    add.add_argument("--agent", required=True, help="the agent definition file its turns are submitted with")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", help="e.g. '*/5 * * * *' (every five minutes), '* * * * * *' (every second)")
    when.add_argument("--in", dest="delay", type=float, metavar="SECONDS", help="fire once, this much later")
    add.add_argument("--request-id", help="idempotency key: the same id and input give the same schedule")
    add.add_argument("--json", action="store_true", help="print it as JSON")
    add.add_argument("input", help="each turn's input")
    listed = actions.add_parser("list", parents=[remote], help="the schedules of the namespace")
    listed.add_argument("--json", action="store_true")
    for name, text in (("pause", "it does not fire until resumed"), ("resume", "it fires again"),
                       ("delete", "it is gone")):  # fmt: skip
        one = actions.add_parser(name, parents=[remote], help=f"{name} a schedule: {text}")
        one.add_argument("schedule_id")
        one.add_argument("--json", action="store_true")


def line(s: dict[str, Any]) -> str:
    when = f"cron {s['cron']!r}" if s["cron"] else "once"
    last = f", last fired for {s['last_due_at']} (turn {s['last_turn_id']})" if s.get("last_due_at") else ""
    error = f", last error: {s['last_error']}" if s.get("last_error") else ""
    return (f"{s['id']} {s['state']}: {when} into {s['session_id']}/{s['thread']} ({s['agent']}), "
            f"next {s['next_at'] or '-'}, fired {s['fires']} time(s){last}{error}")  # fmt: skip


async def _direct(brain: Direct, args: argparse.Namespace) -> Any:
    store, namespace = brain.store, brain.namespace
    if args.action == "add":
        return await schedules.create(
            store, namespace=namespace, request_id=args.request_id or new_id(), session_id=args.session,
            agent=AgentDefinition.from_file(args.agent), text=args.input, cron=args.cron, delay=args.delay,
            thread=args.thread,
        )  # fmt: skip
    if args.action == "list":
        return await schedules.listed(store, namespace=namespace)
    return await schedules.change(
        store, namespace=namespace, schedule_id=args.schedule_id, action=args.action
    )


async def _remote(brain: Remote, args: argparse.Namespace) -> Any:
    if args.action == "add":
        return await brain.client.schedule(
            args.session, args.request_id or new_id(), args.input, AgentDefinition.from_file(args.agent),
            cron=args.cron, delay=args.delay, thread=args.thread,
        )  # fmt: skip
    return await brain.client.schedules(args.action, getattr(args, "schedule_id", None))


async def run(settings: Settings, args: argparse.Namespace) -> int:
    async with access(settings, args.url) as brain:
        found = await (_direct(brain, args) if isinstance(brain, Direct) else _remote(brain, args))  # type: ignore[arg-type]
    if args.json:
        print(json.dumps(found, indent=2, default=str))
    elif args.action == "list":
        for s in found:
            print(line(s))
    elif found["state"] == "deleted":
        print(f"schedule {found['id']} deleted")
    else:
        print(line(found))
    return 0
