"""Forks and rewinds: a thread's conversation cut at a journal seq, snapped back to a boundary.

A fork is a new thread of the same session (the same agent version and frozen bindings) whose
conversation starts as its parent's stood after entry ``at``; a rewind sets an idle thread's own
conversation back the same way. The cut is snapped back to the last entry, at or before ``at``,
after which every tool call the model made has its result (``ThreadHistory.open_calls`` empty):
a fork never starts with a call its model would see dangling, and since the results it carries
are the recorded ones, nothing in it runs a tool again. A call that waited for a person's approval
was open, so a cut never carries a stale approval either.

What the cut keeps travels as one fact, ``thread.forked`` or ``thread.rewound``, in the entry
that makes it: the messages as the model saw them, a tool message by its execution's id (its
outcome is recorded once, in the execution's row) and everything else by its content. Reading
the journal on, ``ThreadHistory`` starts the thread's conversation over from that fact.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from brain.models.base import Message
from brain.rules.history import ThreadHistory
from brain.rules.records import Entry


def cut(
    entries: Iterable[Entry], executions: Mapping[str, Any], thread_id: str, at: int
) -> tuple[int, list[Message]]:
    """The seq the cut at ``at`` snaps back to, and the conversation of ``thread_id`` there
    (``entries``: the thread's, in seq order; ``executions``: the rows their results are made of)."""
    history = ThreadHistory()
    boundary, kept = 0, []
    for entry in entries:
        if entry.seq > at:
            break
        history.extend([entry], executions, thread_id)
        if not any(history.open_calls.values()):
            boundary, kept = entry.seq, list(history.messages)
    if boundary < at and not any(history.open_calls.values()):
        boundary = at  # nothing of the thread after its last entry: the cut is where it was asked
    return boundary, kept


def carried(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """Messages as a fork's fact carries them: a tool message by its execution's id."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool" and m.content.get("execution_id"):
            out.append({"role": "tool", "turn_id": m.turn_id, "execution_id": m.content["execution_id"]})
        else:
            out.append({"role": m.role, "turn_id": m.turn_id, "content": m.content})
    return out
