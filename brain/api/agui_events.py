"""Tendon's journal and previews as AG-UI events (the ``ag-ui-protocol`` package's own types).

The mapping, one translator per stream (it remembers the text it previewed):

- ``turn.accepted`` is RUN_STARTED and the turn's end is RUN_FINISHED (completed) or RUN_ERROR
  (failed; cancelled, with code ``cancelled``); a turn is a run, its thread the AG-UI thread;
- a committed model reply is one step (STEP_STARTED and STEP_FINISHED ``model call N``) holding
  its text as TEXT_MESSAGE_START / CONTENT / END and each tool call as TOOL_CALL_START / ARGS /
  END; a tool's outcome is TOOL_CALL_RESULT (its result, or its error, as JSON text);
- previews (text being streamed) open the reply's text message early and send its pieces as
  they come; the committed reply then only ends it, or sends what the previews missed, so a
  reader never gets the text twice. Previews are never replayed: a reader that resumes gets
  the committed reply whole;
- a message's AG-UI id is its logical id (``brain.rules.messages``), with ``#N`` after it for
  its attempt N past the first: an attempt that was superseded (``message.superseded``) ends its
  text message where it stood, and the next attempt's text is a message of its own;
- every other fact of Tendon's own (approvals, UNKNOWN, controls, lost runs, output) is a CUSTOM
  event named ``tendon.<kind>`` whose value is the fact;
- on the run endpoint, a run that stops at calls that wait for a person ends with a STATE_SNAPSHOT
  and RUN_FINISHED whose outcome is AG-UI's ``interrupt`` (one per call, its id the call id);
  a run that ends sends its STATE_SNAPSHOT before RUN_FINISHED. The state is
  ``{"metadata": the session's, "waiting_for": [{"call_id", "tool", "awaits"}...]}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    Interrupt,
    RunErrorEvent,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunStartedEvent,
    StateSnapshotEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)

from brain.rules.batches import is_child

OUTCOMES = ("execution.succeeded", "execution.failed", "execution.cancelled")


class AguiEvents:
    """Translates one session's stream. ``names``: the AG-UI thread and run ids to use for a
    turn (what an AG-UI client sent in its run request); otherwise the Tendon ids."""

    def __init__(self, names: Mapping[str, tuple[str, str]] | None = None) -> None:
        self._names = dict(names or {})
        self._live: dict[str, tuple[str, str]] = {}  # turn id -> (AG-UI message id, text previewed)

    def _ids(self, entry: Mapping[str, Any]) -> tuple[str, str]:
        turn = str(entry["turn_id"])
        return self._names.get(turn, (str(entry.get("thread_id") or entry["session_id"]), turn))

    def entry(self, entry: Mapping[str, Any], outcomes: Mapping[str, Any]) -> list[BaseEvent]:
        """The events of one journal entry; ``outcomes``: the executions whose outcome it says,
        by id (their ``result`` and ``error``), read by the caller."""
        if entry.get("turn_id") is None:
            return [CustomEvent(name=f"tendon.{f['kind']}", value=f) for f in entry["facts"]]
        thread, run = self._ids(entry)
        out: list[BaseEvent] = []
        for fact in entry["facts"]:
            kind = fact["kind"]
            if kind == "turn.accepted":
                out.append(RunStartedEvent(thread_id=thread, run_id=run))
            elif kind == "turn.model_replied":
                out += self._reply(entry, fact)
            elif kind == "message.superseded":
                out += self._end_live(str(entry["turn_id"]), _agui_id(fact["message_id"], fact["attempt"]))
                out.append(CustomEvent(name=f"tendon.{kind}", value=fact))
            elif kind in OUTCOMES and fact["execution_id"] in outcomes and not is_child(fact["execution_id"]):
                # (a batch's child is no call the model made: its outcome is a CUSTOM event)
                out.append(_result(fact, outcomes[fact["execution_id"]]))
            elif kind == "turn.completed":
                out.append(RunFinishedEvent(thread_id=thread, run_id=run))
            elif kind == "turn.failed":
                error = fact.get("error") or {}
                out.append(
                    RunErrorEvent(
                        message=str(error.get("message", "the turn failed")), code=error.get("code")
                    )
                )
            elif kind == "turn.cancelled":
                out.append(RunErrorEvent(message="the turn was cancelled", code="cancelled"))
            else:
                out.append(CustomEvent(name=f"tendon.{kind}", value=fact))
        return out

    def interrupted(self, entry: Mapping[str, Any], metadata: Mapping[str, str]) -> list[BaseEvent]:
        """The end of a run stopped at the calls of ``entry`` that wait for a person."""
        waiting = [
            {"call_id": f["call_id"], "tool": f.get("tool"), "awaits": f.get("awaits") or "approval"}
            for f in entry["facts"] if f["kind"] == "execution.pending"
        ]  # fmt: skip
        thread, run = self._ids(entry)
        asks = [
            Interrupt(
                id=str(w["call_id"]), reason=f"tool_{w['awaits']}", tool_call_id=str(w["call_id"]),
                message=_asking(w), metadata={"tool": w["tool"], "awaits": w["awaits"]},
            )
            for w in waiting
        ]  # fmt: skip
        return [
            StateSnapshotEvent(snapshot={"metadata": dict(metadata), "waiting_for": waiting}),
            RunFinishedEvent(
                thread_id=thread, run_id=run, outcome=RunFinishedInterruptOutcome(interrupts=asks)
            ),
        ]

    def preview(self, piece: Mapping[str, Any]) -> list[BaseEvent]:
        """A piece of a reply being streamed: its text opens (or goes on in) the reply's message."""
        if piece.get("kind") != "text" or not piece.get("text"):
            return []  # a tool call's arguments go out whole with the committed reply
        turn = str(piece["turn_id"])
        said = _agui_id(piece["message_id"], piece["attempt"]) if "message_id" in piece else None
        out: list[BaseEvent] = []
        if turn in self._live and said is not None and self._live[turn][0] != said:
            out += self._end_live(turn)  # another attempt (or message) streams now
        if turn not in self._live:
            message_id = said or f"{turn}/live/{len(self._live)}"
            self._live[turn] = (message_id, "")
            out.append(TextMessageStartEvent(message_id=message_id, role="assistant"))
        message_id, text = self._live[turn]
        self._live[turn] = (message_id, text + piece["text"])
        out.append(TextMessageContentEvent(message_id=message_id, delta=piece["text"]))
        return out

    def _reply(self, entry: Mapping[str, Any], fact: Mapping[str, Any]) -> list[BaseEvent]:
        message = fact.get("message") or {}
        text = message.get("text") or ""
        number = (fact.get("call") or {}).get("number")
        step = f"model call {number}" if number else "model call"
        out: list[BaseEvent] = [StepStartedEvent(step_name=step)]
        live = self._live.pop(str(entry["turn_id"]), None)
        mine = _agui_id(fact["message_id"], fact.get("attempt", 1)) if fact.get("message_id") else None
        if live is not None and text.startswith(live[1]) and mine in (None, live[0]):
            message_id = live[0]  # opened by its previews: send only what they missed
            if text[len(live[1]) :]:
                out.append(TextMessageContentEvent(message_id=message_id, delta=text[len(live[1]) :]))
            out.append(TextMessageEndEvent(message_id=message_id))
        else:
            if live is not None:  # the previews said something else (a retried call): closed as it is
                out.append(TextMessageEndEvent(message_id=live[0]))
                out.append(CustomEvent(name="tendon.preview_superseded", value={"message_id": live[0]}))
            message_id = mine or f"{entry['turn_id']}/{entry['seq']}"  # or journaled before messages had ids
            if text:
                out.append(TextMessageStartEvent(message_id=message_id, role="assistant"))
                out.append(TextMessageContentEvent(message_id=message_id, delta=text))
                out.append(TextMessageEndEvent(message_id=message_id))
        for call in message.get("tool_calls") or []:
            call_id = str(call["call_id"])
            out.append(
                ToolCallStartEvent(
                    tool_call_id=call_id, tool_call_name=call["tool"], parent_message_id=message_id
                )
            )
            out.append(ToolCallArgsEvent(tool_call_id=call_id, delta=json.dumps(call.get("args") or {})))
            out.append(ToolCallEndEvent(tool_call_id=call_id))
        out.append(StepFinishedEvent(step_name=step))
        return out

    def _end_live(self, turn: str, only: str | None = None) -> list[BaseEvent]:
        """End the text message being previewed for ``turn`` (only if it is ``only``, when given)."""
        live = self._live.get(turn)
        if live is None or (only is not None and live[0] != only):
            return []
        del self._live[turn]
        return [TextMessageEndEvent(message_id=live[0])]


def _asking(waiting: Mapping[str, Any]) -> str:
    if waiting["awaits"] == "result":
        return f"{waiting['tool']} is a tool for you to run: send its result as a tool message or a resume"
    return f'{waiting["tool"]} waits for your approval: resume with true or {{"decision": "deny"}}'


def _agui_id(message_id: str, attempt: int) -> str:
    """The AG-UI id of an attempt's text: the message's own id, ``#N`` after it past the first."""
    return message_id if attempt <= 1 else f"{message_id}#{attempt}"


def _result(fact: Mapping[str, Any], row: Mapping[str, Any]) -> ToolCallResultEvent:
    said = row.get("result") if fact["kind"] == "execution.succeeded" else {"error": row.get("error")}
    if fact["kind"] == "execution.cancelled":
        said = {"error": {"code": "cancelled", "message": fact.get("reason") or "cancelled"}}
    return ToolCallResultEvent(
        message_id=f"{fact['execution_id']}/result", tool_call_id=str(fact["call_id"]),
        content=json.dumps(said, default=str), role="tool",
    )  # fmt: skip


def wire(event: BaseEvent) -> str:
    """An event as AG-UI clients read it: JSON with camelCase names, nothing that is unset."""
    return event.model_dump_json(by_alias=True, exclude_none=True)
