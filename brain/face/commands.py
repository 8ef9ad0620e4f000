"""What each `brain` command does (the parser and the exit codes are in ``brain.face.cli``): each
opens what it needs, calls the verbs (``brain.verbs.sessions``, ``brain.verbs.controls``) and prints."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from rich.console import Console

from brain.face.access import access
from brain.face.client import AsyncClient
from brain.face.render import EXIT_BY_END, print_history, print_turn, waiting_line
from brain.face.watch import watch as follow
from brain.rules.agents import AgentDefinition
from brain.rules.states import TERMINAL_EXECUTION, TERMINAL_TURN, TurnStatus
from brain.store import BrainStore, open_store
from infra.db.parked import show_parked
from infra.process.killpoints import KillPoints
from infra.process.settings import Settings
from protocol import ProtocolError, SchemaError, loads

EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_CONFLICT, EXIT_UNAVAILABLE, EXIT_REJECTED = 1, 2, 3, 4, 5, 6
EXIT_CANCELLED = EXIT_BY_END["cancelled"]
OUTPUT_LOOK = 0.5  # seconds between looks at a running tool's output with nothing new


async def with_store(settings: Settings, work: Callable[[BrainStore], Awaitable[int]]) -> int:
    store = await open_store(settings)
    try:
        return await work(store)
    finally:
        await store.close()


async def submit(settings: Settings, args: argparse.Namespace) -> int:
    agent = AgentDefinition.from_file(args.agent)
    async with access(settings, args.url) as brain:
        said = await brain.submit(
            args.session, args.request_id, args.input, agent, args.thread, expect_tools=args.expect_tools,
            metadata=pairs(args.meta), thread_metadata=pairs(args.thread_meta), strategy=args.if_busy,
        )  # fmt: skip
    print(said["turn_id"], flush=True)
    for warning in said.get("warnings") or ():
        print(f"brain: warning: {warning}", file=sys.stderr)
    return 0


def pairs(given: list[str] | None) -> dict[str, str]:
    """``KEY=VALUE`` arguments as pairs (SchemaError, exit 2, for one without ``=``)."""
    found = {}
    for item in given or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise SchemaError(f"metadata takes KEY=VALUE, not {item!r}")
        found[key] = value
    return found


async def show(settings: Settings, args: argparse.Namespace) -> int:
    async with access(settings, args.url) as brain:
        d = await brain.describe(args.turn_id)
    print(json.dumps(d, indent=2, default=str)) if args.json else print_turn(d)
    return 0


# A waiting turn is asked about again this often, to say in time what it waits for.
SAY_WAITING_WITHIN = 2.0


async def wait(settings: Settings, args: argparse.Namespace) -> int:
    async with access(settings, args.url) as brain:
        deadline = time.monotonic() + args.timeout
        said: str | None = None
        while True:
            # The end is heard at once over a Brain's API, within a look on the database.
            left = deadline - time.monotonic()
            d = await brain.until_ended(args.turn_id, max(0.0, min(SAY_WAITING_WITHIN, left)))
            if d["status"] == TurnStatus.WAITING and d["waiting_for"] != said:
                # Said once per thing it waits for: a wait can last (a reconcile by a person).
                said = d["waiting_for"]
                print(f"brain: {waiting_line(d)}", file=sys.stderr, flush=True)
            if TurnStatus(d["status"]) in TERMINAL_TURN:
                print(json.dumps(d, indent=2, default=str)) if args.json else print_turn(d)
                return EXIT_BY_END[d["status"]]
            if time.monotonic() > deadline:
                # Observers never change work: the turn goes on.
                print(
                    f"turn {args.turn_id} is still {d['status']}"
                    + (f", waiting for {d['waiting_for']}" if d["waiting_for"] else "")
                    + f" after {args.timeout:g}s (it keeps going)",
                    file=sys.stderr,
                )
                return EXIT_TIMEOUT


async def parked(settings: Settings, args: argparse.Namespace) -> int:
    async def work(store: BrainStore) -> int:
        return await show_parked(store, args.parked_id, limit=args.limit, as_json=args.json)

    return await with_store(settings, work)


class Local(Protocol):
    """The whole system in one process (the top-level ``local`` package, which wires Brain and
    Hands together above both): what `brain demo` and `brain serve --local` run."""

    def demo(self, settings: Settings, args: argparse.Namespace) -> int: ...

    async def serve(self, settings: Settings, args: argparse.Namespace, stop: asyncio.Event) -> int: ...


async def serve(settings: Settings, args: argparse.Namespace, *, local: Local | None = None) -> int:
    if args.concurrency:
        settings = settings.model_copy(update={"concurrency": args.concurrency})
    if args.http:
        settings = settings.model_copy(update={"http": args.http})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: its terminal went away
        loop.add_signal_handler(sig, stop.set)
    if args.local:
        if local is None:
            raise SchemaError(
                "--local runs Brain and Hands in one process: start it with the `brain` command"
            )
        return await local.serve(settings, args, stop)
    if args.data_dir or args.tools or args.mcp or args.mcp_config:
        raise SchemaError("--data-dir, --tools, --mcp and --mcp-config go with --local")
    # Imported here: the other commands, a process each, start faster without the server.
    from brain import app

    return await app.serve(settings, KillPoints(settings.kill_at), stop)


async def token(settings: Settings, args: argparse.Namespace) -> int:
    from brain.api.auth import check_namespace, hash_token, new_token

    if args.operator == bool(args.namespace):
        raise SchemaError("give a namespace, or --operator for an operator's token")
    if args.namespace:
        check_namespace(args.namespace)
    made = new_token()
    entry = hash_token(made) if args.operator else f"{args.namespace}:{hash_token(made)}"
    variable = "TENDON_OPERATOR_TOKENS" if args.operator else "TENDON_API_TOKENS"
    print(made)
    print(f"add to {variable} (comma-separated): {entry}", file=sys.stderr)
    return 0


# ---- sessions, threads, turns --------------------------------------------------------------


def _print(data: Any, as_json: bool, text: Callable[[], None]) -> None:
    if as_json:
        print(json.dumps(data, indent=2, default=str))
    else:
        text()


async def threads(settings: Settings, args: argparse.Namespace) -> int:
    async with access(settings, args.url) as brain:
        found = await brain.threads(args.session)

        def text() -> None:
            for t in found:
                state = "closed" if t["closed_at"] else "open"
                fork = f", forked from {t['forked_from']} at {t['forked_at']}" if t.get("forked_from") else ""
                print(
                    f"{t['name']:<16} {state:<6} agent {t['agent_name']} v{t['agent_version']}  "
                    f"{t['turns']} turn(s), {t['unfinished']} unfinished{fork}"
                )

        _print(found, args.json, text)
        return 0


async def turns(settings: Settings, args: argparse.Namespace) -> int:
    async with access(settings, args.url) as brain:
        found = await brain.turns(
            args.session, thread=args.thread, status=args.status, limit=args.limit, after=args.after
        )

        def text() -> None:
            for t in found:
                waits = f"  waiting for {t['waiting_for']}" if t["status"] in ("waiting", "paused") else ""
                print(
                    f"#{t['seq']:<6} {t['id']}  {t['status']:<10} {t['phase']:<14} rev {t['revision']}{waits}"
                )
            if len(found) == args.limit:
                print(f"(more: --after {found[-1]['seq']})")

        _print(found, args.json, text)
        return 0


async def history(settings: Settings, args: argparse.Namespace) -> int:
    async with access(settings, args.url) as brain:
        found = await brain.history(args.turn_id)
    _print(found, args.json, lambda: print_history(found))
    return 0


async def output(settings: Settings, args: argparse.Namespace) -> int:
    """Print what a tool wrote, from byte ``--offset`` on; with ``--follow``, go on as it comes
    until its outcome seals it. A range that never came is said on stderr, in its place."""
    offset = args.offset
    async with access(settings, args.url) as brain:
        while True:
            page = await brain.output(args.execution_id, offset)
            for p in page["pages"]:
                if p["offset"] > offset:
                    lost = f"[output from byte {offset} to {p['offset']} never came]"
                    print(lost, file=sys.stderr, flush=True)
                sys.stdout.write(p["data"])
                offset = p["offset"] + len(p["data"].encode("utf-8"))
            sys.stdout.flush()
            offset = max(offset, page["next"])
            sealed = page["status"] in TERMINAL_EXECUTION and offset >= (page["output_bytes"] or 0)
            if not args.follow or sealed:
                return 0
            if not page["pages"]:
                await asyncio.sleep(OUTPUT_LOOK)


async def close(settings: Settings, args: argparse.Namespace) -> int:
    async with access(settings, args.url) as brain:
        closed = await brain.close(args.session, args.thread)
    what = f"thread {args.thread} of session {args.session}" if args.thread else f"session {args.session}"
    print(f"{what} {'closed' if closed else 'was closed already'}")
    return 0


# ---- controls ---------------------------------------------------------------------------------


async def control(settings: Settings, args: argparse.Namespace) -> int:
    """steer, inject, withdraw, pause, resume and cancel: one receipt each."""
    async with access(settings, args.url) as brain:
        said = await brain.control(
            args.turn_id, args.command, args.request_id, text=getattr(args, "text", None),
            revision=getattr(args, "revision", None), control_id=getattr(args, "control_id", None),
        )  # fmt: skip
    _print(said, args.json, lambda: print(receipt_line(said)))
    return EXIT_REJECTED if said["status"] == "rejected" else 0


def receipt_line(r: dict[str, Any]) -> str:
    when = {"received": "received; it applies at the turn's next boundary", "applied": "applied"}
    line = f"control #{r['control_id']} ({r['kind']}, request {r['request_id']}) of turn {r['turn_id']}: "
    if r["kind"] == "signal":  # a signal no call waited for yet is kept for the first that will
        when["received"] = "received; kept for the turn's first call that waits for its key"
    line += when.get(r["status"], r["status"])
    return line + (f": {r['reason']}" if r.get("reason") else "")


async def respond(settings: Settings, args: argparse.Namespace) -> int:
    if args.result is not None:
        try:
            result = loads(args.result.encode())
        except ProtocolError as exc:
            raise SchemaError(f"--result is not valid JSON: {exc.message}") from exc
        decision = "result"
    else:
        result, decision = None, "approve" if args.approve else "deny"

    async with access(settings, args.url) as brain:
        said = await brain.respond(
            args.turn_id, args.request_id, call=args.call, decision=decision, result=result,
            reason=args.deny or None,
        )  # fmt: skip
    _print(said, args.json, lambda: print(receipt_line(said)))
    return EXIT_REJECTED if said["status"] == "rejected" else 0


async def send_signal(settings: Settings, args: argparse.Namespace) -> int:
    """A signal for the turn's call that waits for its key (a built-in wait_for_signal)."""
    try:
        payload = loads(args.payload.encode()) if args.payload is not None else None
    except ProtocolError as exc:
        raise SchemaError(f"the payload is not valid JSON: {exc.message}") from exc
    async with access(settings, args.url) as brain:
        said = await brain.signal(args.turn_id, args.request_id, args.key, payload)
    _print(said, args.json, lambda: print(receipt_line(said)))
    return EXIT_REJECTED if said["status"] == "rejected" else 0


async def receipts(settings: Settings, args: argparse.Namespace) -> int:
    async with access(settings, args.url) as brain:
        found = await brain.receipts(args.turn_id)
    for r in found if not args.json else ():
        print(receipt_line(r))
    if args.json:
        print(json.dumps(found, indent=2, default=str))
    return 0


async def watch(settings: Settings, args: argparse.Namespace) -> int:
    """Follow a turn live in the terminal, through the HTTP API (resumes after Ctrl-C)."""
    url = args.url or settings.url or f"http://{settings.http}"
    async with AsyncClient(url, settings.token or None) as client:
        return await follow(
            client, args.turn_id, console=Console(highlight=False), from_start=args.from_start
        )
