"""`brain demo`: the five-email story on a bare machine, with a readable timeline.

Everything runs in this process on a data directory: the Brain, the Hands pool of route
``email``, and the mailbox that plays the external system (its state is a file too, so it
survives a crash like a real service would). ``--crash-at N`` SIGKILLs the process while
the N-th email is inside ``send_email``, after the mailbox accepted it; running the same
command again resumes the same turn, reuses the confirmed receipts, verifies the N-th by
its operation id instead of sending it again, and sends the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from brain import verbs
from brain.rules.agents import AgentDefinition
from brain.rules.states import TERMINAL_TURN
from brain.rules.submits import session_key
from brain.store import BrainStore, Entry
from infra.db import Connection
from infra.process.entry import run_async
from infra.process.killpoints import KillPoints
from infra.process.logging import configure_logging
from infra.process.settings import Settings
from local.demo_agents import default_data_dir, demo_agent
from local.demo_files import INTERRUPTED_FILE, SEEN_FILE, reset, resume_command
from local.embedded import DataDir, LocalSystem, run_local
from local.terminal import Erasing, Progress
from protocol import TendonError

SESSION, REQUEST = "demo", "five-emails"
TASK = "Send the maintenance notice to our five customers, then summarize the receipts."
HOW = {
    "ran": "sent",
    "verified_by_query": "the mail service had it: verified by its operation id, not resent",
    "reconciled": "reconciled",
}


@dataclass
class Timeline:
    """Prints public events as they are committed, plus a progress line."""

    out: TextIO
    bar: Progress
    emails: dict[str, str] = field(default_factory=dict)  # execution id -> "email N (to)"
    delivered: set[str] = field(default_factory=set)
    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    seen_file: Path | None = None
    runs_shown: int = 0
    # Executions a crash left unfinished: their "sending" is held back until their outcome says
    # whether the Hands sent it or asked the mail service about it (a line saying "sending"
    # before "not resent" would read like a resend).
    unfinished: set[str] = field(default_factory=set)
    held: dict[str, tuple[str, datetime]] = field(default_factory=dict)

    def seen(self, seq: int) -> None:
        """Remember what was printed, so a rerun can show what a crash kept from view."""
        if self.seen_file is not None:
            # Whole or not at all: the demo is killed at any point, a file cut mid-write reads as ''.
            partial = self.seen_file.with_name(self.seen_file.name + ".partial")
            partial.write_text(str(seq))
            partial.replace(self.seen_file)

    def line(self, text: str, at: datetime | None = None) -> None:
        stamp = f"{((at or datetime.now(UTC)) - self.started).total_seconds():6.2f}s"
        self.clear_progress()
        print(f"{stamp}  {text}", file=self.out, flush=True)

    def clear_progress(self) -> None:
        self.bar.erase()

    def say(self, text: str) -> None:
        """A line of the story that is not an event (what the demo does, where it resumes)."""
        self.clear_progress()
        print(text, file=self.out, flush=True)

    def progress(self) -> None:
        bar = "#" * len(self.delivered) + "." * (5 - len(self.delivered))
        self.bar.draw(f"[{bar}] {len(self.delivered)}/5 emails confirmed")

    def show(self, kind: str, data: dict[str, Any], label: str, at: datetime) -> None:
        if kind.startswith("execution.output"):
            return  # what a tool wrote: the timeline tells what happened to each email, not that
        line = functools.partial(self.line, at=at)
        execution_id = data.get("execution_id")
        held = self.held.pop(execution_id, None) if execution_id else None
        if held is not None and not (
            kind == "execution.succeeded" and data.get("how") == "verified_by_query"
        ):
            self.line(*held)
        if kind == "turn.accepted":
            line("turn accepted and committed")
        elif kind == "turn.run_started":
            # Every wait for a tool ends a run; show only the first of this process.
            if self.runs_shown == 0:
                line(f"run {data['run']} of the turn claimed it at phase {data['phase']}")
            self.runs_shown += 1
        elif kind == "execution.intended":
            line(f"{label}: intent committed (operation id {data['execution_id']})")
        elif kind == "execution.running":
            again = " again after a crash" if data.get("reason") == "rerun_after_crash" else ""
            text = f"{label}: sending{again} (attempt {data.get('attempt', 1)})"
            if execution_id in self.unfinished and not again:
                self.held[execution_id] = (text, at)
            else:
                line(text)
        elif kind == "execution.succeeded":
            self.delivered.add(data["execution_id"])
            if data.get("how") == "verified_by_query":
                # What the Hands did before this answer: they asked instead of sending again.
                line(f"{label}: asking the mail service about operation {data['execution_id']}")
            line(f"{label}: confirmed, {HOW.get(data.get('how', 'ran'), data.get('how'))}")
        elif kind == "execution.unknown":
            line(f"{label}: UNKNOWN ({data.get('reason')}); the turn waits for a reconcile")
        elif kind == "execution.failed":
            line(f"{label}: failed")
        elif kind == "turn.completed":
            line("turn completed")
        elif kind == "turn.failed":
            line(f"turn failed: {data['error'].get('message')}")
        self.progress()


class AlreadyDone(Exception):
    """The data directory's turn ended already: nothing is started."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


def _calls(entries: list[Entry]) -> dict[str, dict[str, Any]]:
    """Each tool call's arguments, by call id, from the model's replies in the journal."""
    calls = {}
    for entry in entries:
        for fact in entry.facts:
            for call in (
                (fact.get("message") or {}).get("tool_calls", [])
                if fact["kind"] == "turn.model_replied"
                else []
            ):
                calls[call["call_id"]] = call.get("args", {})
    return calls


def _label(fact: dict[str, Any], calls: dict[str, dict[str, Any]]) -> str:
    call_id = fact.get("call_id")
    if call_id is None:
        return fact.get("execution_id", "")
    to = calls.get(call_id, {}).get("to", "?")
    return f"email {call_id.removeprefix('call-')} to {to}"


async def _entries(system: LocalSystem, key: str, after: int, upto: int | None = None) -> list[Entry]:
    """The story's journal entries after ``after`` (``key``: the store's key of its session)."""
    store = system.brain
    entries = await store.read(lambda conn: store.journal.entries(conn, key, after=after, limit=100_000))
    return [e for e in entries if upto is None or e.seq <= upto]


async def _recap(system: LocalSystem, key: str, turn_id: str, before: dict[str, str], out: TextIO) -> None:
    store = system.brain
    rows = await store.read(lambda conn: store.executions.turn_executions(conn, turn_id))
    calls = _calls(await _entries(system, key, 0))
    print("\nwhat happened to each email:", file=out)
    for r in (r for r in rows if r["tool"] == "send_email"):
        if before.get(r["id"]) == "succeeded":
            what = "reused the receipt confirmed before"
        else:
            what = HOW.get(r["how"], r["how"] or "?")
        receipt = (r["result"] or {}).get("message_id", "-")
        to = calls.get(r["call_id"], {}).get("to", "?")
        print(f"  {r['call_id']}  {to:<24} {receipt:<8} {what}", file=out)


def _show(entries: list[Entry], calls: dict[str, dict[str, Any]], timeline: Timeline) -> None:
    calls.update(_calls(entries))
    for entry in entries:
        for fact in entry.facts:
            data = {k: v for k, v in fact.items() if k != "kind"}
            timeline.show(fact["kind"], data, _label(fact, calls), entry.created_at)
        timeline.seen(entry.seq)


async def _follow(system: LocalSystem, key: str, turn_id: str, cursor: int, timeline: Timeline) -> Any:
    """Show the session's journal until the turn ends; returns the final turn row."""
    calls = _calls(await _entries(system, key, 0, cursor))
    store = system.brain
    while True:
        entries = await _entries(system, key, cursor)
        _show(entries, calls, timeline)
        if entries:
            cursor = entries[-1].seq
        row = await store.read(lambda conn: store.turns.load(conn, turn_id))
        if (row.status in TERMINAL_TURN and not entries) or system.brain_task.done():
            return row
        if row.status == "waiting" and (row.waiting_for or "").startswith("reconcile"):
            return row  # nothing will change until someone reconciles it
        await asyncio.sleep(0.1)


@dataclass(frozen=True)
class Previous:
    """What an earlier run left in the data directory, read before anything starts."""

    turn_status: str
    executions: dict[str, str]  # execution id -> status
    last_seq: int  # last journal entry committed
    last_shown: int  # last journal entry the earlier run printed
    interrupted: bool  # it ended by a Ctrl-C, not a crash


async def previous_run(store: BrainStore, data: DataDir, namespace: str) -> Previous | None:
    """The earlier run's turn, as the store has it (read before the Brain starts)."""
    key = session_key(namespace, SESSION)

    async def read(conn: Connection) -> Previous | None:
        turn = await store.turns.find_turn(conn, key, REQUEST)
        if turn is None:
            return None
        executions = {
            r["id"]: r["status"]
            for r in await store.executions.turn_executions(conn, turn.id)
            if r["tool"] == "send_email"
        }
        seen = data.root / SEEN_FILE
        last_shown = int(seen.read_text()) if seen.exists() else 0
        last = await store.journal.last_seq(conn, key)
        return Previous(
            str(turn.status), executions, last, last_shown, (data.root / INTERRUPTED_FILE).exists()
        )

    return await store.read(read)


async def run_demo(
    settings: Settings, data: DataDir, *, crash_at: int | None, out: TextIO, model: str | None = None,
    bar: Progress | None = None,
) -> int:  # fmt: skip
    """Run (or resume) the five-email turn; returns 0 when it completed."""
    from examples.mailbox import MailboxServer

    agent = demo_agent(model)
    spec = settings.kill_at
    on_accepted = None
    if crash_at is not None and model is None:
        spec = ",".join(filter(None, [spec, f"hands.after_tool_body@call-{crash_at}"]))
    elif crash_at is not None:
        # A real model names its calls itself: the mail service pulls the plug instead, once it
        # has stored the N-th email and before its sender hears back.
        def on_accepted(n: int) -> None:
            if n == crash_at:
                print(
                    f"tendon: email {n} was accepted by the mail service, SIGKILL",
                    file=sys.stderr,
                    flush=True,
                )
                os.kill(os.getpid(), signal.SIGKILL)

    found: list[Previous | None] = []

    async def before_start(store: BrainStore) -> None:
        previous = await previous_run(store, data, settings.namespace)
        if previous is not None and previous.turn_status in TERMINAL_TURN:
            raise AlreadyDone(previous.turn_status)
        (data.root / INTERRUPTED_FILE).unlink(missing_ok=True)  # said once, below
        found.append(previous)

    with MailboxServer(port=0, state_path=data.root / "mailbox.json", on_accepted=on_accepted) as mailbox:
        os.environ["TENDON_MAILBOX_URL"] = mailbox.url
        try:
            async with run_local(
                settings, data, pools=[("email", "examples.email_tools")], killpoints=KillPoints(spec),
                before_start=before_start,
            ) as system:  # fmt: skip
                told = Timeline(out, bar or Progress(out, out.isatty()), seen_file=data.root / SEEN_FILE)
                return await _tell(system, agent, settings, data, found[0], crash_at, mailbox, told)
        except AlreadyDone as done:
            print(
                f"the five-email turn in {data.root} already {done.status}; "
                "run with --fresh to start the story again",
                file=out,
            )
            return 0 if done.status == "completed" else 1


async def _tell(
    system: LocalSystem, agent: AgentDefinition, settings: Settings, data: DataDir, previous: Previous | None,
    crash_at: int | None, mailbox: Any, timeline: Timeline,
) -> int:  # fmt: skip
    out, say = timeline.out, timeline.say
    if crash_at is not None:
        say(f"(will SIGKILL this process while email {crash_at} is inside send_email)")
    before = previous.executions if previous else {}
    timeline.unfinished = {
        e for e, status in before.items() if status not in ("succeeded", "failed", "cancelled")
    }
    turn_id, _ = await verbs.submit(
        system.brain,
        namespace=settings.namespace,
        session_id=SESSION,
        request_id=REQUEST,
        user_input=TASK,
        agent=agent,
        wake_channel=system.wake_channel,
        tools=verbs.KnownTools(served=system.served),
    )
    cursor, key = 0, session_key(settings.namespace, SESSION)
    if previous is not None:
        done = sum(1 for st in before.values() if st == "succeeded")
        after = "it was interrupted" if previous.interrupted else "the crash"
        say(f"resuming turn {turn_id} from {data.root} after {after}: {done} of 5 emails already confirmed")
        timeline.delivered.update(k for k, st in before.items() if st == "succeeded")
        if previous.last_shown < previous.last_seq:
            say(f"committed before {after}, not shown then:")
            calls = _calls(await _entries(system, key, 0, previous.last_shown))
            _show(await _entries(system, key, previous.last_shown, previous.last_seq), calls, timeline)
            say("after the restart:")
            timeline.runs_shown = 0  # this process's first run is news again
        cursor = previous.last_seq
    else:
        say(f"turn {turn_id} in {data.root}")
    row = await _follow(system, key, turn_id, cursor, timeline)
    timeline.clear_progress()
    await _recap(system, key, turn_id, before, out)
    if row.status == "waiting":
        print(f"\nthe turn waits for a {row.waiting_for}; nothing was guessed", file=out)
        return 3
    if row.status != "completed":
        print(f"\nturn {row.status}: {row.error}", file=out)
        return 1
    print(f"\nsummary from the agent:\n{row.result['text']}", file=out)
    print(f"\nmailbox: {len(mailbox.stats()['deliveries'])} deliveries", file=out)
    return 0


def demo_settings(base: Settings) -> Settings:
    """Snappy defaults for one process: short scans so recovery shows within a second. No HTTP
    API, and no ready file: the demo is not a server, and run in a server's container (which sets
    TENDON_READY_FILE) it must not remove the server's."""
    update = {"scan_interval": min(base.scan_interval, 0.2), "http": "off", "ready_file": None}
    return base.model_copy(update=update)


def main_demo(
    base: Settings, data_dir: Path | None, *, fresh: bool, crash_at: int | None, model: str | None = None,
    log_level: str = "WARNING",
) -> int:  # fmt: skip
    data = DataDir(data_dir or default_data_dir(model))
    # The progress bar is drawn on stdout; whatever goes to stderr (a kill point's last words, a
    # warning, the line a Ctrl-C leaves) erases it first.
    bar = Progress(sys.stdout, sys.stdout.isatty())
    with contextlib.redirect_stderr(Erasing(sys.stderr, bar)):
        configure_logging("console", log_level)  # the timeline is the output; logs only for trouble
        try:
            if fresh:
                reset(data)
            return run_async(
                run_demo(demo_settings(base), data, crash_at=crash_at, out=sys.stdout, model=model, bar=bar)
            )
        except KeyboardInterrupt:
            if data.root.exists():
                (data.root / INTERRUPTED_FILE).write_text("interrupted by Ctrl-C\n")
            print(
                f"brain: interrupted; `{resume_command(data_dir, model)}` resumes the story", file=sys.stderr
            )
            return 130
        except BrokenPipeError:
            raise  # the output's reader went away: not the data directory's doing (infra.process.entry)
        except OSError as exc:
            raise TendonError(f"cannot use {data.root} as the data directory: {exc.strerror or exc}") from exc
