"""`brain`: serve the Brain, submit turns, wait for them and show what happened."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import Any

from brain.face import commands, forks, schedule
from brain.face.commands import (
    EXIT_CANCELLED,
    EXIT_CONFLICT,
    EXIT_FAILED,
    EXIT_REJECTED,
    EXIT_TIMEOUT,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)
from brain.rules.names import MAX_ID, MAX_REQUEST_ID, MAX_SESSION_ID, check_id, check_thread_name
from infra.process.cli import ExitCodes, add_parked_command, reported
from infra.process.entry import run_async
from infra.process.logging import configure_logging
from infra.process.settings import Settings, bad_setting, unknown_variables

EXIT_CODES = f"""exit codes:
  0  done (submit: the turn is accepted and durable; wait: it completed; a control: received or
     applied, as its receipt says)
  {EXIT_FAILED}  the turn failed (wait, watch)
  {EXIT_USAGE}  bad input (an id that does not exist, is too long or holds a control character, a
     closed thread, JSON that is not strict, a submitted agent naming a tool no Hands pool has
     announced or a model kind no Brain has...) or a bad TENDON_* setting
  {EXIT_TIMEOUT}  still not finished after --timeout (wait); the turn goes on
  {EXIT_CONFLICT}  CONFLICT: the request id was used before with a different input (or the agent
     version exists with other content, or the thread is pinned to another); nothing was changed
  {EXIT_UNAVAILABLE}  a service (PostgreSQL, RabbitMQ, S3) could not be reached or refused the request
  {EXIT_REJECTED}  the control was rejected: its receipt says why (the turn ended, a stale revision...)
  {EXIT_CANCELLED}  the turn was cancelled (wait, watch)
  130  interrupted (Ctrl-C)"""
EXITS = ExitCodes(conflict=EXIT_CONFLICT, usage=EXIT_USAGE, unavailable=EXIT_UNAVAILABLE)


def _remote() -> argparse.ArgumentParser:
    """``--url``: the verbs go through a Brain's HTTP API instead of the database."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--url",
        help="a Brain's HTTP API to go through (TENDON_URL, token in TENDON_TOKEN), instead of the "
        "database (TENDON_DATABASE_URL)",
    )
    return parent


def _parser() -> argparse.ArgumentParser:
    remote = _remote()
    p = argparse.ArgumentParser(
        prog="brain",
        description="Tendon Brain: runs agent turns durably on PostgreSQL and sends tool calls "
        "to Hands pools over RabbitMQ. Settings come from TENDON_* environment variables.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser(
        "serve",
        help="run a Brain process until SIGTERM/SIGINT, with its HTTP API",
        description="Run a Brain: it claims turns, calls the model and applies tool results, and "
        "serves the HTTP API (OpenAPI at /openapi.json) on TENDON_HTTP (127.0.0.1:8080). It waits "
        "for PostgreSQL, RabbitMQ and S3 at start (TENDON_SERVICE_WAIT_SECONDS); on SIGTERM its runs "
        "reach their next commit (TENDON_DRAIN_SECONDS) and it hands its turns back.",
    )
    s.add_argument("--concurrency", type=int, help="turns driven at once (TENDON_CONCURRENCY)")
    s.add_argument("--http", metavar="HOST:PORT", help="where to serve the HTTP API, or off (TENDON_HTTP)")
    s.add_argument(
        "--local",
        action="store_true",
        help="a development server: a Brain, a Hands pool per route of --tools and the HTTP API in this "
        "process, on a data directory (SQLite, a local queue): no servers needed",
    )
    s.add_argument(
        "--data-dir", type=Path, help="with --local: where everything is kept (default .tendon/local)"
    )
    s.add_argument(
        "--tools", action="append", default=[], metavar="MODULE",
        help="with --local: a tools module (or .py file) whose routes get a pool; repeat for more",
    )  # fmt: skip
    s.add_argument(
        "--mcp", action="append", default=[], metavar="ROUTE=SPEC",
        help="with --local: an MCP server whose tools route ROUTE serves ('stdio:COMMAND LINE' or an "
        "http(s) URL, as `hands serve --mcp`); repeat for more",
    )  # fmt: skip
    s.add_argument(
        "--mcp-relist", type=float, default=None, metavar="SECONDS",
        help="with --local: list the --mcp servers' tools again this often (as `hands serve --mcp-relist`)",
    )  # fmt: skip
    s.add_argument(
        "--mcp-config", action="append", default=[], metavar="ROUTE=FILE",
        help="with --local: a config file of MCP servers whose tools route ROUTE serves (as `hands "
        "serve --mcp-config`)",
    )  # fmt: skip

    s = sub.add_parser(
        "token",
        help="make a bearer token for the HTTP API and print the line that configures it",
        description="Prints a new token (give it to the client) and its NAMESPACE:SHA256 entry for "
        "TENDON_API_TOKENS (the server keeps only the hash); --operator makes an operator's.",
    )
    s.add_argument("namespace", nargs="?", help="the namespace the token acts in")
    s.add_argument("--operator", action="store_true", help="a token for the operator routes")

    s = sub.add_parser(
        "submit",
        help="submit a turn; prints its turn id once it is durable",
        description="Submit a turn and print its id once it is committed. The same request id "
        "with the same input prints the same turn, however many submits race; with another "
        "input it is a CONFLICT (exit code 4). An agent naming a tool no Hands pool has ever "
        "announced (a misspelt name), or a model kind no Brain has, is refused (exit code 2) with "
        "what it may name, unless --expect-tools. Warns (on stderr) when no Hands pool serves a "
        "tool the agent names right now (its turn waits for one).",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[remote],
    )
    s.add_argument("--session", required=True, help="session id (created on first use)")
    s.add_argument(
        "--request-id",
        required=True,
        help="idempotency key: the same id and input return the same turn",
    )
    s.add_argument("--agent", required=True, help="path to the agent definition (JSON)")
    s.add_argument(
        "--thread",
        default="main",
        help="the session's thread (created on first use, pinned to the agent's version; default main): "
        "turns of one thread run in order, threads run in parallel",
    )
    s.add_argument(
        "--expect-tools",
        action="store_true",
        help="take tools no Hands pool has announced yet (a pool that starts later) instead of refusing "
        "them as unknown; the agent's expect_tools field says it for some tools, in the definition",
    )
    s.add_argument(
        "--meta", action="append", metavar="KEY=VALUE", help="set on the session (repeatable); searchable"
    )
    s.add_argument(
        "--thread-meta", action="append", metavar="KEY=VALUE", help="set on the thread (repeatable)"
    )
    s.add_argument(
        "--if-busy",
        choices=["reject", "enqueue", "interrupt", "rollback"],
        default="enqueue",
        help="when the thread has an unfinished turn: refuse (exit code 4), queue behind it (default), "
        "cancel it keeping its work in the history (interrupt), or cancel it and drop its work (rollback)",
    )
    s.add_argument("input", help="the user's input for this turn")

    s = sub.add_parser(
        "wait", help="wait until a turn completes or fails (never cancels it)", parents=[remote]
    )
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
        help="where everything is kept (default: .tendon/demo, or .tendon/demo-openai-NAME with --model)",
    )
    s.add_argument(
        "--model",
        metavar="openai:NAME",
        help="tell the story with a real model of an OpenAI-compatible API (hosted, vLLM, Ollama, "
        "LiteLLM): OPENAI_BASE_URL and OPENAI_API_KEY say where (default: the scripted model)",
    )
    s.add_argument(
        "--agent",
        metavar="MODULE:ATTR",
        help="tell the story with an agent written with Pydantic AI or the OpenAI Agents SDK "
        "(examples.pydantic_email:agent), its own model asked (OPENAI_BASE_URL, OPENAI_API_KEY)",
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

    s = sub.add_parser(
        "show", help="show a turn: status, revision, conversation, executions", parents=[remote]
    )
    s.add_argument("turn_id")
    s.add_argument("--json", action="store_true", help="machine-readable output")

    s = sub.add_parser(
        "history",
        help="a turn's runs, model calls (attempts, latency, usage, LOST) and steps, with times, in words",
        parents=[remote],
    )
    s.add_argument("turn_id")
    s.add_argument("--json", action="store_true", help="machine-readable output")

    s = sub.add_parser(
        "output",
        help="what a tool wrote as it ran (an execution id, as `brain show` lists them)",
        parents=[remote],
    )
    s.add_argument("execution_id")
    s.add_argument("--offset", type=int, default=0, help="the byte to start from (default 0)")
    s.add_argument("--follow", "-f", action="store_true", help="go on as it comes, until the tool's outcome")

    s = sub.add_parser(
        "threads", help="a session's threads, their agent versions and turns", parents=[remote]
    )
    s.add_argument("session")
    s.add_argument("--json", action="store_true", help="machine-readable output")

    s = sub.add_parser(
        "turns", help="a session's turns in accepted order, a page at a time", parents=[remote]
    )
    s.add_argument("session")
    s.add_argument("--thread", help="only this thread's")
    s.add_argument("--status", help="only turns in this status (queued, running, waiting, paused, ...)")
    s.add_argument("--limit", type=int, default=50, help="turns per page (default 50)")
    s.add_argument("--after", type=int, default=0, help="the turn number the previous page ended at")
    s.add_argument("--json", action="store_true", help="machine-readable output")

    s = sub.add_parser(
        "close",
        help="close a session, or one thread of it: no more turns; refused while one is unfinished",
        parents=[remote],
    )
    s.add_argument("session")
    s.add_argument("--thread", help="close only this thread")

    s = sub.add_parser(
        "watch",
        help="follow a turn live in the terminal (through the HTTP API); Ctrl-C and run it again to resume",
        description="Prints each journal entry of the turn as it commits, with its time, in words, and the "
        "model's reply as it streams; the last entry shown is saved, so watching again goes on from there. "
        "Exits when "
        "the turn ends: 0 completed, 1 failed, 7 cancelled. Watching changes nothing of the turn.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("turn_id")
    s.add_argument("--url", help="the Brain's HTTP API (default TENDON_URL, else http:// and TENDON_HTTP)")
    s.add_argument("--from-start", action="store_true", help="show the whole turn again")

    _add_controls(sub, remote)
    schedule.add_parser(sub, remote)
    forks.add_parsers(sub, remote)
    return p


def _add_controls(sub: argparse._SubParsersAction, remote: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    common = argparse.ArgumentParser(add_help=False, parents=[remote])
    common.add_argument(
        "--request-id",
        help="idempotency key: the same id and input return the original receipt (default: a new one)",
    )
    common.add_argument("--json", action="store_true", help="print the receipt as JSON")
    helps = {
        "steer": "add guidance for the model at the turn's next boundary (between model steps)",
        "inject": "add user input to the turn at its next boundary (between model steps)",
        "withdraw": "take back a steer or inject that is not applied yet",
        "pause": "stop the turn at its next boundary; its tool results still come in",
        "resume": "let a paused turn go on (give the revision you saw: `brain show TURN`)",
        "cancel": "cancel the turn: at once if nothing runs, else once its running tools are settled",
    }
    for name, text in helps.items():
        s = sub.add_parser(
            name, help=text, description=f"{text[0].upper()}{text[1:]}. Prints the control's receipt.",
            parents=[common], epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
        )  # fmt: skip
        s.add_argument("turn_id")
        if name in ("steer", "inject"):
            s.add_argument("text")
        elif name == "withdraw":
            s.add_argument("control_id", type=int, help="the steer's or inject's control id (its receipt)")
        elif name == "resume":
            s.add_argument("--revision", type=int, required=True, help="the turn's revision you saw")
    s = sub.add_parser(
        "respond",
        help="answer a call that waits for a person: approve or deny it, give a manual tool's result, "
        "or the input a running call asks for (an MCP task's)",
        parents=[common], epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    s.add_argument("turn_id")
    s.add_argument("call", help="the call id (or execution id) that waits (`brain show TURN`)")
    answer = s.add_mutually_exclusive_group(required=True)
    answer.add_argument("--approve", action="store_true", help="send the call to its tool")
    answer.add_argument(
        "--deny", metavar="REASON", nargs="?", const="", help="refuse it (the model is told why)"
    )
    answer.add_argument(
        "--result", metavar="JSON", help="a manual tool's result, or the input a running call asks for"
    )
    s = sub.add_parser(
        "signal", help="send a signal to a turn's call that waits for it (wait_for_signal)",
        parents=[common], epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    s.add_argument("turn_id")
    s.add_argument("key", help="the signal's key, under `x.` (x.payment.done)")
    s.add_argument("payload", nargs="?", help="JSON the waiting call gets as its result (default null)")
    s = sub.add_parser("controls", help="a turn's controls and where each stands", parents=[remote])
    s.add_argument("turn_id")
    s.add_argument("--json", action="store_true", help="machine-readable output")


def main(argv: list[str] | None = None, *, local: commands.Local | None = None) -> int:
    """The `brain` command; ``local``: what runs the whole system in this process (`brain demo`,
    `brain serve --local`), given by the command's entry point (``local.cli``)."""
    args = _parser().parse_args(argv)
    try:
        settings = Settings()
    except ValueError as exc:  # pydantic's ValidationError among them
        print(f"brain: {bad_setting(exc)}", file=sys.stderr)
        return EXIT_USAGE
    for line in unknown_variables(os.environ):
        print(f"brain: warning: {line}", file=sys.stderr)
    if args.command == "demo":
        if local is None:
            print("brain: the demo runs Brain and Hands in one process: run it with the `brain` command",
                  file=sys.stderr)  # fmt: skip
            return EXIT_USAGE
        return local.demo(settings, args)
    configure_logging(settings.log_format, settings.log_level, process="brain")
    commands_by_name: dict[str, Callable[[Settings, argparse.Namespace], Coroutine[Any, Any, int]]] = {
        "serve": partial(commands.serve, local=local),
        "token": commands.token,
        "submit": commands.submit,
        "wait": commands.wait,
        "show": commands.show,
        "parked": commands.parked,
        "history": commands.history,
        "output": commands.output,
        "threads": commands.threads,
        "turns": commands.turns,
        "close": commands.close,
        "controls": commands.receipts,
        "watch": commands.watch,
        "respond": commands.respond,
        "signal": commands.send_signal,
        "schedule": schedule.run,
        "fork": forks.run,
        "rewind": forks.run,
        **{kind: commands.control for kind in ("steer", "inject", "withdraw", "pause", "resume", "cancel")},
    }
    command = commands_by_name[args.command]

    def run() -> int:
        check_ids(args)  # what the API refuses, refused here alike: before anything is opened
        return run_async(command(settings, args))

    return reported("brain", run, EXITS)


# The arguments that are ids, with what each is called and how long it may be (brain.rules.names).
ID_ARGUMENTS = {
    "session": ("session id", MAX_SESSION_ID),
    "request_id": ("request id", MAX_REQUEST_ID),
    "turn_id": ("turn id", MAX_ID),
    "call": ("call id", MAX_ID),
}


def check_ids(args: argparse.Namespace) -> None:
    """Refuse (SchemaError: one line, exit code 2) an argument that is no id, as the API does."""
    for name, (what, limit) in ID_ARGUMENTS.items():
        value = getattr(args, name, None)
        if isinstance(value, str):
            check_id(what, value, limit)
    if isinstance(getattr(args, "thread", None), str):
        check_thread_name(args.thread)


if __name__ == "__main__":
    sys.exit(main())
