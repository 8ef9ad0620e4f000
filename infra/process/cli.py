"""What the ``brain`` and ``hands`` commands share: how an error reaches the user, and the
``parked`` command's arguments and output (its reads are ``infra.db.parked``'s).

An error that is the user's or a service's (not a bug) is one line on stderr, prefixed with the
command's name, and an exit code for its kind (:class:`Fault`); each command says which code
each kind gets (``brain --help`` lists them; ``hands`` exits 2 for all). A bug keeps its
traceback: that is what helps.
"""

from __future__ import annotations

import argparse
import json
import select
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import asyncpg

from infra.process.entry import EXIT_INTERRUPTED
from protocol import ConflictError, TendonError


class Fault(StrEnum):
    """What kind of error a command reports."""

    CONFLICT = "conflict"  # the request was made before with another input; nothing changed
    USAGE = "usage"  # bad input: an id that does not exist, data the database cannot take...
    UNAVAILABLE = "unavailable"  # a service could not be reached or refused the request


@dataclass(frozen=True)
class ExitCodes:
    """The exit code of each kind of error, for one command."""

    conflict: int
    usage: int
    unavailable: int

    def of(self, fault: Fault) -> int:
        codes = {Fault.CONFLICT: self.conflict, Fault.USAGE: self.usage, Fault.UNAVAILABLE: self.unavailable}
        return codes[fault]


def reported(command: str, run: Callable[[], int], codes: ExitCodes) -> int:
    """``run()``'s exit code; an error it raises that is no bug as one line on stderr and the
    exit code of its kind (:func:`explained`), a Ctrl-C as 130."""
    try:
        return run()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        if isinstance(exc, BrokenPipeError) and _output_closed():
            raise  # not a service's fault: ``infra.process.entry.run`` says the output was closed
        said = explained(exc)
        if said is None:
            raise  # a bug: the traceback is what helps
        fault, line = said
        print(f"{command}: " + " ".join(line.split()), file=sys.stderr)  # one line, even with a DETAIL
        return codes.of(fault)


def _output_closed() -> bool:
    """Whether stdout's reader went away (``brain wait TURN | head -3``): a broken pipe can also be
    a service's connection. The write end of a pipe whose reader closed it polls as an error."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by something without a descriptor
        return False
    if not hasattr(select, "poll"):  # Windows
        return True
    poller = select.poll()
    poller.register(fd, 0)  # errors are reported whatever the mask
    return any(events & select.POLLERR for _, events in poller.poll(0))


def explained(exc: BaseException) -> tuple[Fault, str] | None:
    """The kind of ``exc`` and what to tell the user about it in one line (naming the service
    where its type says which); None if it is a bug."""
    if isinstance(exc, ConflictError):
        return Fault.CONFLICT, f"CONFLICT: {exc.message}"
    if isinstance(exc, TendonError):
        return (Fault.UNAVAILABLE if exc.retryable else Fault.USAGE), exc.message
    said = _unavailable(exc)
    if said is not None:
        return Fault.UNAVAILABLE, said
    if isinstance(exc, asyncpg.PostgresError):
        # Data it cannot take (class 22, 23) is the input's fault; anything else the service's.
        fault = Fault.USAGE if str(exc.sqlstate or "")[:2] in ("22", "23") else Fault.UNAVAILABLE
        return fault, f"the database refused the request: {type(exc).__name__}: {exc}"
    return None


def _unavailable(exc: BaseException) -> str | None:
    """What to say about a service that cannot be reached or refuses the login or the request
    (but for data the database refuses); None for anything else."""
    # The broker's client (aio-pika's aiormq) and the object store's (botocore) are looked up, not
    # imported: a command that never loaded one cannot have met its errors.
    amqp = sys.modules.get("aiormq.exceptions")
    if amqp is not None and isinstance(exc, amqp.ProbableAuthenticationError):
        return f"the broker refused the login: {exc}"
    if isinstance(exc, asyncpg.PostgresConnectionError | asyncpg.InterfaceError):
        return f"cannot reach the database: {type(exc).__name__}: {exc}"
    if amqp is not None and isinstance(exc, amqp.AMQPConnectionError):
        return f"cannot reach the broker: {type(exc).__name__}: {exc}"
    if isinstance(exc, OSError):  # refused, unreachable or dropped: which service, it does not say
        return f"cannot reach a service: {type(exc).__name__}: {exc}"
    if isinstance(exc, asyncpg.InvalidAuthorizationSpecificationError):
        return f"the database refused the login: {exc}"
    if amqp is not None and isinstance(exc, amqp.AMQPError):
        return f"the broker refused the request: {type(exc).__name__}: {exc}"
    boto = sys.modules.get("botocore.exceptions")  # loaded only where S3 is configured
    if boto is not None and isinstance(exc, boto.BotoCoreError | boto.ClientError):
        return f"the object store refused the request: {type(exc).__name__}: {exc}"
    return None


# ---- the `parked` command -----------------------------------------------------------------


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
