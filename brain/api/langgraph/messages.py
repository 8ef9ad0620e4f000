"""A thread's conversation as LangGraph's clients read it, and a run's journal entries as its
stream parts. Pure: the callers read the entries and the executions.

- The conversation is ``brain.rules.history``'s (rolled-back turns left out), each message a
  LangChain-style dict: ``human`` (the input), ``ai`` (a model reply, with ``tool_calls``), ``tool``
  (an execution's outcome, JSON in ``content``). A message's id is its turn's id and its place in
  that turn, so the state, the history and every stream name a message alike.
- One journal entry of the run's turn makes, in each mode asked: ``values`` (the whole state
  after it, when it added a message), ``updates`` (``{"model" | "tools": {"messages": new}}``),
  ``messages`` (``messages-tuple``: ``[message, metadata]`` per new ai or tool message),
  ``events`` (``on_chat_model_end`` and ``on_tool_end``), ``custom`` (each fact of Tendon's own:
  approvals, controls, waits, UNKNOWN...). An interrupt adds ``__interrupt__`` to ``values`` and
  ``updates``; a failed turn ends with an ``error`` part.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from brain.rules.history import ThreadHistory
from brain.rules.records import Entry

MODES = ("values", "updates", "messages-tuple", "messages", "events", "custom")
# Facts that say a message: the conversation carries them; every other fact is a custom part.
_MESSAGE_FACTS = {"turn.accepted", "turn.prepared", "turn.model_replied", "turn.results_applied"}
ENDS = {"turn.completed": "success", "turn.failed": "error", "turn.cancelled": "interrupted"}


def lc_message(message: Any, message_id: str) -> dict[str, Any]:
    """One Tendon message (``brain.models.base.Message``: its role and content) as a LangChain
    message dict."""
    c = message.content
    if message.role == "assistant":
        calls = [
            {"name": t["tool"], "args": t.get("args") or {}, "id": t["call_id"], "type": "tool_call"}
            for t in c.get("tool_calls") or []
        ]
        return {"type": "ai", "content": c.get("text") or "", "tool_calls": calls, "invalid_tool_calls": [],
                "id": message_id, "name": None, "additional_kwargs": {}, "response_metadata": {}}  # fmt: skip
    if message.role == "tool":
        failed = c.get("status") != "succeeded"
        said = {"error": c.get("error")} if failed else c.get("result")
        return {"type": "tool", "content": json.dumps(said, default=str), "tool_call_id": c.get("call_id"),
                "name": c.get("tool"), "status": "error" if failed else "success", "id": message_id,
                "additional_kwargs": {}, "response_metadata": {}}  # fmt: skip
    kwargs = {"tendon_role": "steer"} if message.role == "steer" else {}
    return {"type": "human", "content": c.get("text") or "", "id": message_id, "name": None,
            "additional_kwargs": kwargs, "response_metadata": {}}  # fmt: skip


@dataclass
class Conversation:
    """A thread's conversation, brought up to date one entry at a time."""

    thread_id: str
    history: ThreadHistory = field(default_factory=ThreadHistory)
    seen: set[str] = field(default_factory=set)

    def add(self, entry: Entry, executions: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Take one entry in; the messages it added."""
        self.history.extend([entry], executions, self.thread_id)
        new = [m for m in self.messages() if m["id"] not in self.seen]
        self.seen.update(m["id"] for m in new)
        return new

    def messages(self) -> list[dict[str, Any]]:
        places: dict[str, int] = {}
        out = []
        for m in self.history.messages:
            places[m.turn_id] = places.get(m.turn_id, 0) + 1
            out.append(lc_message(m, f"{m.turn_id}-{places[m.turn_id]}"))
        return out

    def values(self) -> dict[str, Any]:
        return {"messages": self.messages()}


def interrupts(pending: Iterable[Mapping[str, Any]], args: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The interrupts of calls that wait for a person (``execution.pending`` facts or execution
    rows): each its call id, and what it waits for (``approval`` or a manual tool's ``result``)."""
    out = []
    for p in pending:
        awaits = p.get("awaits") or (p.get("how") or "").removeprefix("awaiting_") or "approval"
        call_id = p["call_id"]
        value = {"awaits": awaits, "tool": p.get("tool"), "call_id": call_id, "args": args.get(call_id)}
        out.append({"id": call_id, "value": value})
    return out


def call_args(messages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {t["id"]: t["args"] for m in messages if m["type"] == "ai" for t in m["tool_calls"]}


@dataclass
class Parts:
    """A run's stream parts, one entry of its turn at a time: (event, data) pairs."""

    modes: Sequence[str]
    run_id: str
    thread_id: str

    def of(self, entry: Entry, new: list[dict[str, Any]], convo: Conversation) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        meta = {"run_id": self.run_id, "thread_id": self.thread_id, "langgraph_step": entry.seq}
        if new and "values" in self.modes:
            out.append(("values", convo.values()))
        for node, said in _by_node(new):
            if "updates" in self.modes:
                out.append(("updates", {node: {"messages": said}}))
            for m in said:
                if "messages-tuple" in self.modes:
                    out.append(("messages", [m, {**meta, "langgraph_node": node}]))
                if "messages" in self.modes:
                    out.append(("messages/complete", [m]))
                if "events" in self.modes:
                    kind = "on_chat_model_end" if node == "model" else "on_tool_end"
                    name = "model" if node == "model" else m.get("name")
                    out.append(("events", {"event": kind, "name": name, "run_id": self.run_id,
                                           "data": {"output": m}, "metadata": meta}))  # fmt: skip
        for fact in entry.facts:
            if fact.get("kind") not in _MESSAGE_FACTS and "custom" in self.modes:
                out.append(("custom", {"tendon": fact}))
        return out

    def interrupted(self, convo: Conversation, waiting: list[dict[str, Any]]) -> list[tuple[str, Any]]:
        """The parts that say the run stopped at calls that wait for a person."""
        out: list[tuple[str, Any]] = []
        if "updates" in self.modes:
            out.append(("updates", {"__interrupt__": waiting}))
        if "values" in self.modes:
            out.append(("values", {**convo.values(), "__interrupt__": waiting}))
        return out

    def ended(self, fact: Mapping[str, Any], convo: Conversation) -> list[tuple[str, Any]]:
        """The parts of the turn's end: an error part for a failed one."""
        out: list[tuple[str, Any]] = []
        if "events" in self.modes:
            out.append(("events", {"event": "on_chain_end", "name": "LangGraph", "run_id": self.run_id,
                                   "data": {"output": convo.values()}}))  # fmt: skip
        if fact["kind"] == "turn.failed":
            error = fact.get("error") or {}
            out.append(("error", {"error": error.get("code", "error"), "message": error.get("message", "")}))
        return out


def _by_node(new: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """New messages by the graph node LangGraph's prebuilt agent would name: ``model`` for a
    reply, ``tools`` for tool results (the input, a human message, is no node's update)."""
    out: list[tuple[str, list[dict[str, Any]]]] = []
    for m in new:
        node = {"ai": "model", "tool": "tools"}.get(m["type"])
        if node is None:
            continue
        if out and out[-1][0] == node:
            out[-1][1].append(m)
        else:
            out.append((node, [m]))
    return out
