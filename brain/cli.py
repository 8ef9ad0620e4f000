"""`brain`: serve the Brain, submit turns, wait for them and show what happened."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg

from brain import verbs
from brain.agents import AgentDefinition
from brain.app import open_store, serve, wake_channel
from brain.demo import main_demo
from brain.states import TERMINAL_TURN, TurnStatus
from brain.store import BrainStore
from brain.views import describe, print_turn, waiting_line
from infra.broker import Broker
from infra.killpoints import KillPoints
from infra.logging import configure_logging
from infra.parked import add_parked_command, show_parked
from infra.settings import Settings
from infra.transport import Topology
from protocol import ConflictError, TendonError

EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_CONFLICT, EXIT_UNAVAILABLE = 1, 2, 3, 4, 5
EXIT_CODES = f"""exit codes:
  0  done (submit: the turn is accepted and durable; wait: it completed)
  {EXIT_FAILED}  the turn failed (wait)
  {EXIT_USAGE}  bad input or a bad TENDON_* setting
  {EXIT_TIMEOUT}  still not finished after --timeout (wait); the turn goes on
  {EXIT_CONFLICT}  CONFLICT: the request id was used before with a different input (or the agent
     version exists with other content); nothing was changed
  {EXIT_UNAVAILABLE}  a service (PostgreSQL, RabbitMQ, S3) could not be reached or refused the request
  130  interrupted (Ctrl-C)"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="brain",
        description="Tendon Brain: runs agent turns durably on PostgreSQL and sends tool calls "
        "to Hands pools over RabbitMQ. Settings come from TENDON_* environment variables.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run a Brain process until SIGTERM/SIGINT")
    s.add_argument("--concurrency", type=int, help="turns driven at once (TENDON_CONCURRENCY)")

    s = sub.add_parser(
        "submit",
        help="submit a turn; prints its turn id once it is durable",
        description="Submit a turn and print its id once it is committed. The same request id "
        "with the same input prints the same turn, however many submits race; with another "
        "input it is a CONFLICT (exit code 4). Warns (on stderr) when no Hands pool serves a "
        "tool the agent names right now.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("--session", required=True, help="session id (created on first use)")
    s.add_argument(
        "--request-id",
        required=True,
        help="idempotency key: the same id and input return the same turn",
    )
    s.add_argument("--agent", required=True, help="path to the agent definition (JSON)")
    s.add_argument("input", help="the user's input for this turn")

    s = sub.add_parser("wait", help="wait until a turn completes or fails (never cancels it)")
    s.add_argument("turn_id")
    s.add_argument("--timeout", type=float, default=300.0, help="seconds to wait (default 300)")
    s.add_argument("--json", action="store_true", help="print the final state as JSON")

    s = sub.add_parser(
        "demo",
        help="run the five-email story on this machine, no servers needed",
        description="Runs a Brain, a Hands pool and a mailbox in this process on a data "
        "directory (SQLite, a local queue, a directory object store) and shows the timeline. "
        "Run it again on the same directory to resume after a crash.",
    )
    s.add_argument(
        "--data-dir",
        type=Path,
        default=Path(".tendon/demo"),
        help="where everything is kept (default: .tendon/demo)",
    )
    s.add_argument("--fresh", action="store_true", help="start over: forget the data directory")
    s.add_argument(
        "--crash-at",
        type=int,
        choices=range(1, 6),
        metavar="N",
        help="SIGKILL this process while email N (1-5) is inside send_email, after the mailbox accepted it",
    )

    add_parked_command(
        sub,
        what="the Brain",
        surfacing="the Brain reads back the updates and bindings announcements parked, fails the "
        "turn a parked update concerns (saying why) or logs them",
    )

    s = sub.add_parser("show", help="show a turn: status, history, executions")
    s.add_argument("turn_id")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    return p


async def _with_store(settings: Settings, work: Callable[[BrainStore], Awaitable[int]]) -> int:
    store = await open_store(settings)
    try:
        return await work(store)
    finally:
        await store.close()


async def _submit(settings: Settings, args: argparse.Namespace) -> int:
    agent = AgentDefinition.from_file(args.agent)

    async def work(store: BrainStore) -> int:
        turn_id, created = await verbs.submit(
            store,
            namespace=settings.namespace,
            session_id=args.session,
            request_id=args.request_id,
            user_input=args.input,
            agent=agent,
            wake_channel=wake_channel(settings),
        )
        print(turn_id, flush=True)
        if created and agent.tools:
            await _warn_unserved(store, settings, agent)
        return 0

    return await _with_store(settings, work)


async def _warn_unserved(store: BrainStore, settings: Settings, agent: AgentDefinition) -> None:
    """Say so when a tool the agent names would not run now (the turn waits for it)."""
    topology = Topology(settings.queue_prefix)

    async def problems() -> list[str]:
        async with Broker(settings.amqp_url, topology) as broker:
            return await verbs.unserved_tools(store, broker, topology, agent.tools)

    try:
        found = await asyncio.wait_for(problems(), 10)
    except Exception as exc:  # noqa: BLE001 - only a warning: the turn is accepted already
        print(f"brain: warning: could not check which tools are served: {exc!r}", file=sys.stderr)
        return
    for problem in found:
        print(
            f"brain: warning: {problem}; the turn waits for one as long as the Brain's "
            "TENDON_BINDING_WAIT_SECONDS allow (start `hands serve --route ROUTE --tools MODULE`)",
            file=sys.stderr,
        )


async def _show(settings: Settings, args: argparse.Namespace) -> int:
    async def work(store: BrainStore) -> int:
        d = await describe(store, args.turn_id)
        print(json.dumps(d, indent=2, default=str)) if args.json else print_turn(d)
        return 0

    return await _with_store(settings, work)


async def _wait(settings: Settings, args: argparse.Namespace) -> int:
    async def work(store: BrainStore) -> int:
        deadline = time.monotonic() + args.timeout
        said: str | None = None
        while True:
            d = await describe(store, args.turn_id)
            if d["status"] == TurnStatus.WAITING and d["waiting_for"] != said:
                # Said once per thing it waits for: a wait can last (a reconcile by a person).
                said = d["waiting_for"]
                print(f"brain: {waiting_line(d)}", file=sys.stderr, flush=True)
            if TurnStatus(d["status"]) in TERMINAL_TURN:
                print(json.dumps(d, indent=2, default=str)) if args.json else print_turn(d)
                return 0 if d["status"] == TurnStatus.COMPLETED else EXIT_FAILED
            if time.monotonic() > deadline:
                # Observers never change work: the turn goes on.
                print(
                    f"turn {args.turn_id} is still {d['status']}"
                    + (f", waiting for {d['waiting_for']}" if d["waiting_for"] else "")
                    + f" after {args.timeout:g}s (it keeps going)",
                    file=sys.stderr,
                )
                return EXIT_TIMEOUT
            await asyncio.sleep(0.2)

    return await _with_store(settings, work)


async def _parked(settings: Settings, args: argparse.Namespace) -> int:
    async def work(store: BrainStore) -> int:
        return await show_parked(store, args.parked_id, limit=args.limit, as_json=args.json)

    return await _with_store(settings, work)


async def _serve(settings: Settings, args: argparse.Namespace) -> int:
    if args.concurrency:
        settings = settings.model_copy(update={"concurrency": args.concurrency})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: its terminal went away
        loop.add_signal_handler(sig, stop.set)
    return await serve(settings, KillPoints(settings.kill_at), stop)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = Settings()
    except ValueError as exc:
        print(f"brain: bad TENDON_* setting: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "demo":
        # The timeline is the output; logs only for what goes wrong.
        configure_logging(
            "console", "WARNING" if "TENDON_LOG_LEVEL" not in os.environ else settings.log_level
        )
        try:
            return main_demo(settings, args.data_dir, fresh=args.fresh, crash_at=args.crash_at)
        except TendonError as exc:
            print(f"brain: {exc.message}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt:
            return 130
    configure_logging(settings.log_format, settings.log_level, process="brain")
    command = {"serve": _serve, "submit": _submit, "wait": _wait, "show": _show, "parked": _parked}[
        args.command
    ]
    try:
        return asyncio.run(command(settings, args))
    except ConflictError as exc:
        print(f"brain: CONFLICT: {exc.message}", file=sys.stderr)
        return EXIT_CONFLICT
    except TendonError as exc:
        print(f"brain: {exc.message}", file=sys.stderr)
        return EXIT_UNAVAILABLE if exc.retryable else EXIT_USAGE
    except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError) as exc:
        print(f"brain: cannot reach a service: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except asyncpg.PostgresError as exc:
        print(f"brain: the database refused the request: {exc}", file=sys.stderr)
        # Data it cannot take (class 22, 23) is the input's fault; anything else the service's.
        return EXIT_USAGE if str(exc.sqlstate or "")[:2] in ("22", "23") else EXIT_UNAVAILABLE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
