"""Durable waits: the built-in tools a Brain answers itself (a pure rule).

An agent names them in its ``tools`` like any other; no Hands pool serves them and nothing is
sent. A call of one is a PENDING execution with what it awaits (its ``how``) and, where the clock
answers it, a deadline in its row (``wait_until``): the turn waits as a row, holding no worker slot,
no model call and no process, and wakes from that row (invariant 20).

==================  =========================  ================================================
tool                waits for                  answered by
==================  =========================  ================================================
sleep(seconds)      the clock                  the repair scan once ``seconds`` passed
wait_for_signal     a signal ``key`` (``x.``)  `brain signal` / ``POST /v1/turns/ID/signals``;
(key, timeout)                                 the clock after ``timeout`` (none: forever)
request_approval    a person's approval        `brain respond --approve` (or ``--deny``), in the
(question, payload)                            namespace of the turn, once
==================  =========================  ================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from brain.rules.records import Intent
from protocol import digest

ROUTE = "brain"  # the route a built-in's binding names: the Brain itself, never a Hands pool
SIGNAL_PREFIX = "x."
MAX_SECONDS = 366 * 24 * 3600.0  # a year and a day: a longer wait is a schedule's job

_SECONDS = {"type": "number", "minimum": 0, "maximum": MAX_SECONDS}
_SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "sleep": (
        "Wait this many seconds, then go on. Nothing runs meanwhile.",
        {"type": "object", "properties": {"seconds": _SECONDS}, "required": ["seconds"],
         "additionalProperties": False},
    ),
    "wait_for_signal": (
        "Wait until someone sends the signal `key` (it starts with `x.`) to this turn; its payload is "
        "the result. `timeout`: seconds to wait at most (none: wait forever).",
        {"type": "object", "properties": {
            "key": {"type": "string", "pattern": r"^x\.\S+$", "maxLength": 200},
            "timeout": {"anyOf": [_SECONDS, {"type": "null"}]},
        }, "required": ["key"], "additionalProperties": False},
    ),
    "request_approval": (
        "Ask a person to approve something (the question, and any data they should see); the "
        "result says whether they approved it.",
        {"type": "object", "properties": {"question": {"type": "string", "minLength": 1}, "payload": {}},
         "required": ["question"], "additionalProperties": False},
    ),
}  # fmt: skip
# What each built-in awaits (the execution's ``how`` while PENDING is ``awaiting_<this>``).
AWAITS = {"sleep": "clock", "wait_for_signal": "signal", "request_approval": "approval"}


def _binding(name: str) -> dict[str, Any]:
    description, schema = _SCHEMAS[name]
    fields = {"name": name, "description": description, "input_schema": schema}
    return {**fields, "version": "builtin", "route": ROUTE, "replay_policy": "safe", "builtin": True,
            "digest": digest(fields)}  # fmt: skip


BUILTINS: dict[str, dict[str, Any]] = {name: _binding(name) for name in _SCHEMAS}
NAMES = frozenset(BUILTINS)


def builtin_intent(execution_id: str, step: int, call: Mapping[str, Any], *, detailed: bool) -> Intent:
    """A built-in's call, its arguments checked: PENDING with what it awaits, its signal key and the
    seconds until the clock answers it (None: only a signal or a person does)."""
    tool, args = call["tool"], call["args"]
    seconds = args.get("seconds") if tool == "sleep" else args.get("timeout")
    return Intent(
        execution_id=execution_id, tool_step=step, call_id=call["call_id"], route=ROUTE, tool=tool,
        binding_digest=BUILTINS[tool]["digest"], replay_policy="safe", request_digest="-",
        command_message_id="-", command=None, queue="", journal_detail=detailed, status="pending",
        awaits=AWAITS[tool], wait_key=args.get("key"),
        wait_seconds=float(seconds) if seconds is not None else None,
    )  # fmt: skip


def timed_out(tool: str, wait_key: str | None, waited: float | None) -> tuple[str, dict[str, Any]]:
    """What the clock makes of a wait whose time came: its ``how`` and its result."""
    if tool == "sleep":
        return "slept", {"slept": waited}
    return "timed_out", {"key": wait_key, "timed_out": True, "waited": waited}


def signalled(key: str, payload: Any) -> dict[str, Any]:
    """The result of a wait its signal answered."""
    return {"key": key, "payload": payload, "timed_out": False}


def signal_refusal(key: str) -> str | None:
    """Why a signal key is refused (a pure rule), or None: keys live under ``x.``."""
    if not key.startswith(SIGNAL_PREFIX) or len(key) <= len(SIGNAL_PREFIX) or any(c.isspace() for c in key):
        return f"a signal key starts with {SIGNAL_PREFIX!r} and has no spaces, not {key!r}"
    if len(key) > 200:
        return "a signal key is at most 200 characters"
    return None
