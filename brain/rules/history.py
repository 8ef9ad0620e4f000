"""The conversation a thread's model sees, read from the journal (invariant 16: it is not kept
beside it).

A thread's messages are facts of its journal entries, in seq order:

==========================  ===========================================================
fact                        message
==========================  ===========================================================
``turn.accepted``           none yet: it carries the turn's input, kept for its prepare
``turn.prepared``           the user's message: that turn's input
``turn.model_replied``      the assistant's message (its text and tool calls)
``turn.results_applied``    one tool message per execution it names, made from the
                            execution's row (its outcome is recorded once, there); a batch's
                            children are none: the batch call's result reports them
``turn.input_added``        a steer (an instruction) or an inject (the user's message) that
                            a control added between two model steps
``history.message``         a message as an earlier version of Tendon kept it
``thread.forked``,          the conversation starts over as the fact carries it: a fork's
``thread.rewound``          first, or an idle thread set back (``brain.rules.forks``)
``turn.rolled_back``        none: every message of that turn leaves the conversation, and
                            its later facts add none (its entries stay, for audit)
``turn.cancelled``,         a tool message for each call of the turn's replies that has none
``turn.failed``             yet (a call whose reply committed but whose execution did not:
                            it never ran): the model never sees a call without its result
==========================  ===========================================================

A cancel or a failure that ends a turn waiting for its step's results applies them in its own
commit (``turn.results_applied``, ``brain.store.controls.Controls.closing``): what the model reads
of an interrupted call is its execution's outcome, cancelled with why, or what it did before the
cancel reached it.

``brain.run.history.HistoryCache`` keeps each thread's messages in the Brain process that drives
it, and reads only the entries committed since it last looked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from brain.models.base import Message
from brain.rules.batches import is_child
from brain.rules.records import Entry


def tool_message(row: Mapping[str, Any]) -> dict[str, Any]:
    """What the model is told of one execution's outcome."""
    return {
        "call_id": row["call_id"],
        "tool": row["tool"],
        "execution_id": row["id"],
        "status": row["status"],
        "result": row["result"],
        "error": row["error"],
        "how": row["how"],
    }


RESTARTS = ("thread.forked", "thread.rewound")


def needed_executions(entries: Iterable[Entry]) -> list[str]:
    """The executions whose outcomes the tool messages of ``entries`` are made of."""
    needed = []
    for entry in entries:
        for fact in entry.facts:
            if fact.get("kind") == "turn.results_applied":
                needed += [e for e in fact.get("executions", []) if not is_child(e)]
            elif fact.get("kind") in RESTARTS:
                needed += [m["execution_id"] for m in fact.get("messages", []) if "execution_id" in m]
    return needed


@dataclass
class ThreadHistory:
    """A thread's conversation up to journal seq ``seq`` of its session."""

    seq: int = 0
    messages: list[Message] = field(default_factory=list)
    inputs: dict[str, Any] = field(default_factory=dict)  # turn id -> input, until prepared
    valid_for: tuple[str, int] | None = None  # (turn id, revision) it is known complete for
    open_calls: dict[str, dict[str, str]] = field(default_factory=dict)  # turn id -> call id -> tool
    rolled_back: set[str] = field(default_factory=set)  # turns whose messages left the conversation

    def extend(self, entries: Iterable[Entry], executions: Mapping[str, Any], thread_id: str) -> None:
        """Add the messages of ``entries`` (this thread's, in seq order, after ``seq``)."""
        for entry in entries:
            self.seq = max(self.seq, entry.seq)
            if entry.thread_id not in (None, thread_id):
                continue
            turn_id = entry.turn_id or ""
            for fact in entry.facts:
                self._add(turn_id, fact, executions)

    def _add(self, turn_id: str, fact: Mapping[str, Any], executions: Mapping[str, Any]) -> None:
        kind = fact.get("kind")
        if turn_id in self.rolled_back:
            return
        if kind == "turn.rolled_back":
            self.rolled_back.add(turn_id)
            self.messages = [m for m in self.messages if m.turn_id != turn_id]
            self.inputs.pop(turn_id, None)
            self.open_calls.pop(turn_id, None)
        elif kind in ("turn.cancelled", "turn.failed", "turn.completed"):
            self._close(turn_id, str(kind).removeprefix("turn."))
        elif kind == "turn.accepted" and "input" in fact:
            self.inputs[turn_id] = fact["input"]
        elif kind == "turn.prepared" and turn_id in self.inputs:
            self.messages.append(Message(role="user", turn_id=turn_id, content=self.inputs.pop(turn_id)))
        elif kind == "turn.model_replied" and "message" in fact:
            self.messages.append(Message(role="assistant", turn_id=turn_id, content=fact["message"]))
            calls = fact["message"].get("tool_calls") or []
            self.open_calls.setdefault(turn_id, {}).update({c["call_id"]: c["tool"] for c in calls})
        elif kind == "turn.results_applied":
            for execution_id in fact.get("executions", []):
                row = executions.get(execution_id)
                if row is not None and not is_child(execution_id):
                    self.messages.append(Message(role="tool", turn_id=turn_id, content=tool_message(row)))
                    self.open_calls.get(turn_id, {}).pop(row["call_id"], None)
        elif kind == "turn.input_added":
            role = "steer" if fact.get("control") == "steer" else "user"
            self.messages.append(Message(role=role, turn_id=turn_id, content={"text": fact["text"]}))
        elif kind == "history.message":
            self.messages.append(Message(role=fact["role"], turn_id=turn_id, content=fact["content"]))
        elif kind in RESTARTS:
            self._restart(fact.get("messages", []), executions)

    def _restart(self, carried: Iterable[Mapping[str, Any]], executions: Mapping[str, Any]) -> None:
        """The conversation starts over as a fork or a rewind carried it (``brain.rules.forks``)."""
        self.messages, self.inputs, self.open_calls = [], {}, {}
        for m in carried:
            if "execution_id" in m:
                row = executions.get(m["execution_id"])
                if row is not None:
                    self.messages.append(
                        Message(role="tool", turn_id=m["turn_id"], content=tool_message(row))
                    )
            else:
                self.messages.append(Message(role=m["role"], turn_id=m["turn_id"], content=m["content"]))

    def _close(self, turn_id: str, ended: str) -> None:
        """A tool message for each call of a turn that ended with no result for it: a call whose
        reply committed but whose execution never did (the end of a turn with executions applies
        their outcomes itself; a completed turn's last reply made no call)."""
        for call_id, tool in sorted(self.open_calls.pop(turn_id, {}).items()):
            said = f"its turn was {ended} before this call was sent to its tool"
            error = {"code": "not_sent", "message": said}
            content = {"call_id": call_id, "tool": tool, "execution_id": None, "status": "cancelled",
                       "result": None, "error": error, "how": None}  # fmt: skip
            self.messages.append(Message(role="tool", turn_id=turn_id, content=content))
