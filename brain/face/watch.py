"""`brain watch TURN`: follow a turn live in the terminal, through the HTTP API.

Each journal entry of the turn prints as it commits, with its time, in words (messages, tool
calls and what became of them, controls, runs); the model's reply streams in as it is written.
The id of the last entry shown is saved after each one, so a watch stopped with Ctrl-C (or cut
off) resumes where it stopped: nothing shown twice, nothing skipped. Watching changes nothing of
the turn."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from brain.face.client import AsyncClient
from brain.face.render import EXIT_BY_END, clock
from brain.rules.words import latency, said

ENDED = {"turn.completed": "completed", "turn.failed": "failed", "turn.cancelled": "cancelled"}
STYLE = {"succeeded": "green", "completed": "green", "failed": "red", "unknown": "red", "cancelled": "yellow"}


def cursor_file(turn_id: str) -> Path:
    """Where the last entry shown of ``turn_id`` is kept between watches."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "tendon" / "watch" / f"{turn_id}.cursor"


def _tone(kind: str, fact: dict[str, Any]) -> str | None:
    """The colour of a fact's line: how it ended, or that it waits."""
    status = kind.rpartition(".")[2]
    if kind in ENDED:
        return STYLE[ENDED[kind]]
    rerun = kind == "execution.running" and fact.get("reason") == "rerun_after_crash"
    if kind in ("turn.run_lost", "message.superseded") or rerun:
        return "yellow"
    if fact.get("how") not in (None, "ran", "manual"):  # verified by query, reconciled, refused, denied
        return "magenta" if status == "succeeded" else "red"
    if kind.startswith("execution.") and status in STYLE:
        return STYLE[status]
    if kind in ("turn.waiting", "execution.pending", "control.rejected"):
        return "yellow"
    return "dim" if kind in ("turn.run_started", "turn.prepared", "turn.results_applied") else None


def describe(fact: dict[str, Any]) -> str:
    """One fact of the journal as a line in words (rich markup): the conversation as it is said,
    everything else as ``brain.rules.words`` says it."""
    kind = str(fact.get("kind", "?"))
    if kind == "turn.accepted":
        return f"[bold]user[/]: {escape(str(fact['input'].get('text', '')))}"
    if kind == "turn.model_replied":
        message = fact.get("message") or {}
        calls = [f"{c.get('tool')}({c.get('call_id')})" for c in message.get("tool_calls") or []]
        took = (fact.get("call") or {}).get("latency_ms")
        text = escape(str(message.get("text") or ""))
        asks = "asks for " + ", ".join(calls) if calls else ""
        again = f", attempt {fact['attempt']}" if (fact.get("attempt") or 1) > 1 else ""
        words = " ".join(p for p in (text, asks) if p)
        return f"[bold]agent[/] [dim](in {latency(took)}{again})[/]: {words}"
    if kind == "turn.input_added":
        return f"[bold]user[/] ({fact.get('control')}): {escape(str(fact.get('text', '')))}"
    tone = _tone(kind, fact)
    line = escape(said(fact))
    return f"[{tone}]{line}[/]" if tone else line


async def watch(
    client: AsyncClient,
    turn_id: str,
    *,
    console: Console,
    from_start: bool = False,
    saved: Path | None = None,
) -> int:
    """Follow ``turn_id`` until it ends; its exit code says how it ended (``EXIT_BY_END``)."""
    saved = saved or cursor_file(turn_id)
    turn = await client.turn(turn_id)
    cursor = 0 if from_start or not saved.exists() else int(saved.read_text() or 0)
    if cursor:
        console.print(f"[dim]resuming after event {cursor} (--from-start shows it all again)[/]")
    console.print(f"turn [bold]{turn_id}[/] of session {turn['session_id']}, thread {turn['thread']}")
    saved.parent.mkdir(parents=True, exist_ok=True)
    where = {"thread": turn["thread"], "turn": turn_id}
    shown = Shown(console, turn_id, saved)
    if turn["status"] in ENDED.values():
        # Ended already: what is left to show is all there (a stream would wait for more).
        async for event in client.list_events(turn["session_id"], cursor=cursor, **where):
            shown.entry(event)
        console.print(
            f"the turn {turn['status']}" + ("" if shown.entries else f" (nothing after event {cursor})")
        )
        return EXIT_BY_END[turn["status"]]
    events = client.events(turn["session_id"], cursor=cursor, previews=True, **where)
    async with contextlib.aclosing(events):
        async for event in events:
            await shown.event(event)
            if shown.ended is not None:
                break
    return EXIT_BY_END.get(shown.ended or "failed", 1)


class Shown:
    """What the terminal has shown of a turn, and the id of its last entry (saved)."""

    def __init__(self, console: Console, turn_id: str, saved: Path) -> None:
        self.console, self.turn_id, self.saved = console, turn_id, saved
        self.ended: str | None = None
        self.streaming = False
        self.attempt: tuple[Any, Any] = (None, None)  # the message and attempt streaming
        self.entries = 0

    async def event(self, event: dict[str, Any]) -> None:
        if "preview" in event:
            piece = event["preview"]
            text = piece.get("text")
            if text and piece.get("turn_id") == self.turn_id:
                attempt = (piece.get("message_id"), piece.get("attempt"))
                if self.streaming and attempt != self.attempt:  # another attempt starts over
                    self.console.print()
                if attempt != self.attempt and (piece.get("attempt") or 1) > 1:
                    self.console.print(f"[yellow](attempt {piece['attempt']})[/] ", end="")
                self.attempt = attempt
                self.console.print(f"[dim]{escape(text)}[/]", end="")
                self.streaming = True
        elif "resync" in event:
            cursor = event["resync"]["cursor"]
            self.console.print(f"[yellow]older events were trimmed: going on from {cursor}[/]")
        else:
            self.entry(event)

    def entry(self, event: dict[str, Any]) -> None:
        if self.streaming:
            self.console.print()
            self.streaming = False
        at = clock(event.get("at"))
        for fact in event["facts"]:
            self.console.print(f"[dim]{at} #{event['seq']:>4}[/] {describe(fact)}")
            self.ended = ENDED.get(str(fact.get("kind")), self.ended)
        # Saved in the same step as shown, with no await between (a small file): Ctrl-C cancels
        # the watch at an await, so it never stops between showing an entry and saving it.
        _save(self.saved, int(event["seq"]))
        self.entries += 1


def _save(path: Path, seq: int) -> None:
    # Replaced whole, never truncated in place: a watch killed while saving keeps the last cursor.
    fresh = path.with_suffix(".tmp")
    fresh.write_text(str(seq))
    os.replace(fresh, path)
