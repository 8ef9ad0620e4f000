"""`brain fork` and `brain rewind` (``brain.verbs.forks``), on the Brain's database or through a
Brain's HTTP API (``--url`` / ``TENDON_URL``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from brain.face.access import Direct, Remote, access
from brain.verbs import forks
from infra.process.settings import Settings

SEQ = "the #N of a `brain watch` line or the console's"
THREAD = "the thread: its session's id for the main thread, SESSION/NAME for another"


def add_parsers(sub: argparse._SubParsersAction, remote: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    s = sub.add_parser(
        "fork", parents=[remote], help="a new thread whose conversation is a thread's up to a journal seq",
        description="Make a new thread of the same session, agent version and tools whose conversation is "
        "THREAD's as it stood after journal entry --at (the session's last by default), snapped back to "
        "where every tool call had its result: its turns start from the recorded results and never run a "
        "tool again. Submit to it with --thread NAME. The same --name again prints the same fork.",
    )  # fmt: skip
    s.add_argument("thread_id", metavar="THREAD", help=THREAD)
    s.add_argument("--at", type=int, help=f"the journal seq to cut at ({SEQ})")
    s.add_argument("--name", help="the new thread's name (default fork-<id>)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s = sub.add_parser(
        "rewind", parents=[remote], help="set an idle thread's conversation back to a journal seq",
        description="Set THREAD's conversation back, in place, to what it was after journal entry --at "
        "(snapped back likewise); its next turn goes on from there. Refused while a turn of it is "
        "unfinished.",
    )  # fmt: skip
    s.add_argument("thread_id", metavar="THREAD", help=THREAD)
    s.add_argument("--at", type=int, required=True, help=f"the journal seq to set it back to ({SEQ})")
    s.add_argument("--json", action="store_true", help="machine-readable output")


async def run(settings: Settings, args: argparse.Namespace) -> int:
    async with access(settings, args.url) as brain:
        if isinstance(brain, Direct):
            if args.command == "fork":
                done = await forks.fork(brain.store, brain.namespace, args.thread_id, args.at, name=args.name)
            else:
                done = await forks.rewind(brain.store, brain.namespace, args.thread_id, args.at)
        else:
            assert isinstance(brain, Remote)
            name = getattr(args, "name", None)
            done = await brain.client.thread_action(args.command, args.thread_id, at=args.at, name=name)
    print(json.dumps(done, indent=2) if args.json else _line(args.command, done))
    return 0


def _line(command: str, done: dict[str, Any]) -> str:
    cut = f"at {done['at']}" + (
        f" (snapped back to {done['snapped_to']})" if done["snapped_to"] != done["at"] else ""
    )
    if command == "rewind":
        return f"thread {done['thread_id']} set back {cut}: {done['messages']} message(s)"
    made = "forked" if done["created"] else "was forked already"
    return (
        f"thread {done['thread_id']} {made} from {done['forked_from']} {cut}: {done['messages']} message(s)"
    )
