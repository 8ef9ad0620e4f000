"""What a journal fact means, in plain words (a pure rule): what `brain history` and `brain watch`
print instead of fact names. The console says the same in its own script (``brain/api/web/words.js``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from brain.rules.batches import is_child

# How an execution's outcome came about, by its ``how``.
HOW = {
    "ran": "ran",
    "verified_by_query": "verified by query: its worker died inside the tool, and the worker that took it "
    "over asked the external system about its operation id instead of running it again",
    "reconciled": "reconciled by an operator, with evidence",
    "rejected": "refused by the Brain before anything was sent",
    "denied": "denied by a person",
    "manual": "answered by a person",
    "approved": "approved by a person",
    "slept": "its sleep ended",
    "timed_out": "its wait for a signal timed out",
    "signalled": "answered by its signal",
    "batch": "every call of the batch settled",
    "not_run": "not run: its batch stopped after a failure",
    "delegated": "answered by its child turn",
    "partial": "answered by its child turn, with what it had when its budget was spent",
    "refused": "refused: no child turn was started",
}
AWAITS = {
    "approval": "a person's approval",
    "result": "a person's result (a manual tool)",
    "clock": "its time (a sleep)",
    "signal": "a signal",
    "batch": "the calls of its batch",
    "admission": "its turn in its batch",
    "child": "its child turn (a delegate)",
    "input": "a person's input (what the tool asks: `brain respond TURN CALL --result JSON`)",
}


def _call(f: Mapping[str, Any]) -> str:
    return f"{f.get('tool') or 'a tool'} ({f.get('call_id') or f.get('execution_id') or '?'})"


def _short(value: Any, limit: int = 120) -> str:
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def latency(ms: float | None) -> str:
    """A duration in milliseconds as people read it."""
    if ms is None:
        return "an unrecorded time"
    if ms < 1:  # a fast stub's call rounds to 0.0, and "0 ms" reads like a missing figure
        return "<1 ms"
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def usage_words(usage: Mapping[str, Any] | None) -> str:
    """A model call's usage: "12 prompt, 30 completion tokens" (other counts by their names)."""
    counts = {k: v for k, v in (usage or {}).items() if isinstance(v, int | float)}
    tokens = [
        f"{v} {k.removesuffix('_tokens').replace('_', ' ')}"
        for k, v in counts.items()
        if k.endswith("_tokens")
    ]
    other = [f"{v} {k.replace('_', ' ')}" for k, v in counts.items() if not k.endswith("_tokens")]
    return ", ".join(([", ".join(tokens) + " tokens"] if tokens else []) + other)


def _reply(f: Mapping[str, Any]) -> str:
    message = f.get("message") or {}
    calls = [f"{c.get('tool')}({c.get('call_id')})" for c in message.get("tool_calls") or []]
    took = f" in {latency((f.get('call') or {}).get('latency_ms'))}" if f.get("call") else ""
    used = usage_words(f.get("usage"))
    said = f": {_short(message['text'])!r}" if message.get("text") else ""
    asks = f"; it asks for {', '.join(calls)}" if calls else ""
    again = f" (attempt {f['attempt']})" if (f.get("attempt") or 1) > 1 else ""
    return f"the model replied{again}{took}" + (f" ({used})" if used else "") + said + asks


def _model_calls(execution_ids: Iterable[str]) -> int:
    """The calls the model made among ``execution_ids``: a batch's children are applied with their
    batch but are no calls of the model's (its conversation has no message for them)."""
    return sum(1 for e in execution_ids if not is_child(e))


def _scheduled(schedule: Mapping[str, Any] | None) -> str:
    if not schedule:
        return ""
    said = f", submitted by schedule {schedule.get('id')} for {schedule.get('due_at')}"
    if "late_seconds" in schedule:
        missed = schedule.get("missed", 0)
        said += f", late by {schedule['late_seconds']:g} s ({missed} time(s) missed meanwhile)"
    return said


def _execution(kind: str, f: Mapping[str, Any]) -> str:
    status = kind.removeprefix("execution.")
    how = f.get("how") or "ran"
    if status == "intended":
        return f"{_call(f)} was committed as execution {f.get('execution_id')}, before anything was sent"
    if status == "pending":
        return f"{_call(f)} waits for {AWAITS.get(f.get('awaits') or '', 'a person')}"
    if status == "approved":
        return f"a person approved {_call(f)}: it is sent to its Hands"
    if status == "accepted":
        return f"{_call(f)} was accepted by Hands worker {f.get('worker') or '?'}"
    if status == "running" and f.get("reason") == "rerun_after_crash":
        where = f.get("worker") or "another worker"
        return (f"{_call(f)} runs again (attempt {f.get('attempt')}) on {where}: the worker running it died, "
                "and the tool is safe to run again")  # fmt: skip
    if status == "running":
        return (
            f"{_call(f)} started (attempt {f.get('attempt') or 1}) on {f.get('worker') or 'a Hands worker'}"
        )
    if status in ("succeeded", "failed"):
        return f"{_call(f)} {status}: {HOW.get(how, how)}"
    if status == "unknown":
        return f"{_call(f)} is UNKNOWN: {f.get('reason')}; the turn waits until an operator reconciles it"
    if status == "cancelled":
        return f"{_call(f)} was cancelled" + (f": {f['reason']}" if f.get("reason") else "")
    if status == "output":
        cut = " (cut short here)" if f.get("cut") else ""
        wrote = f"{_call(f)} wrote {f.get('size')} bytes of output (attempt {f.get('attempt') or 1})"
        return f"{wrote}: {_short(f.get('text') or '')!r}{cut}"
    if status == "output_gap":
        return f"{_call(f)}: its output from byte {f.get('start')} to {f.get('end')} never came"
    if status == "input_required":
        return f"{_call(f)} asks a person for input: {_short(f.get('message') or '?')!r}"
    if status == "input_given":
        gave = "declined it" if f.get("decision") == "decline" else "gave it"
        return f"a person {gave}; the answer goes to its Hands, and {_call(f)} goes on"
    if status == "reported_late":
        return f"{_call(f)} was reported {f.get('reported')} after its turn had settled it"
    return f"{_call(f)}: {status}"


def _control(kind: str, f: Mapping[str, Any]) -> str:
    status = kind.removeprefix("control.")
    what = f"the {f.get('control')} (control #{f.get('control_id')})"
    if status == "received":
        return f"{what} was received; it applies at the next boundary"
    return f"{what} was {status}" + (f": {f['reason']}" if f.get("reason") else "")


def _batch_progress(f: Mapping[str, Any]) -> str:
    counts = (
        f"{f.get('done')} done, {f.get('failed')} failed, {f.get('in_flight')} running, "
        f"{f.get('waiting')} waiting"
    )
    what = [f"{len(f['admitted'])} call(s) started"] if f.get("admitted") else []
    what += [f"{f['skipped']} call(s) will not run"] if f.get("skipped") else []
    what += [f"it {f['ended']}"] if f.get("ended") else []
    return f"batch {f.get('call_id')}: {', '.join(what) or 'progress'} ({counts})"


def _forked(f: Mapping[str, Any]) -> str:
    source = f"copied from session {f['from_session']}, " if f.get("from_session") else "forked from "
    return f"{source}thread {f.get('from')} at {f.get('at')}{_snapped(f)}"


def _webhook_failed(f: Mapping[str, Any]) -> str:
    return (
        f"the webhook of run {f.get('run_id')} was given up after {f.get('attempts')} tries: {f.get('error')}"
    )


def _snapped(f: Mapping[str, Any]) -> str:
    """Where a fork's or a rewind's cut was snapped back to, and what it carries."""
    moved = f.get("snapped_to") != f.get("at")
    back = f" (snapped back to {f.get('snapped_to')}, where every tool call had its result)" if moved else ""
    return f"{back}: {len(f.get('messages') or [])} message(s)"


def said(fact: Mapping[str, Any]) -> str:
    """One fact of the journal as a sentence (without its final stop)."""
    kind = str(fact.get("kind", ""))
    if kind.startswith("execution."):
        return _execution(kind, fact)
    if kind.startswith("control."):
        return _control(kind, fact)
    if kind == "turn.model_replied":
        return _reply(fact)
    if kind == "turn.run_started":
        return (
            f"run {fact.get('run')} began at phase {fact.get('phase')}, on {fact.get('owner') or 'a Brain'}"
        )
    if kind == "message.superseded":
        which = f"attempt {fact.get('attempt')} of message {fact.get('message_id')}"
        return f"{which} was superseded: {fact.get('why')}"
    if kind == "turn.run_lost":
        why = "its Brain died" if fact.get("how") == "died" else "its Brain stopped"
        return f"run {fact.get('run')} was lost at phase {fact.get('phase')}: {why}; another run takes over"
    simple = {
        "turn.accepted": lambda f: (
            f"the turn was accepted: {(f.get('input') or {}).get('text', '')!r}"
            + _scheduled(f.get("schedule"))
        ),
        "turn.prepared": lambda f: "the input joined the thread's conversation",
        "turn.waiting": lambda f: f"the turn waits for {f.get('waiting_for')}",
        "turn.results_applied": lambda f: (
            f"the results of {_model_calls(f.get('executions') or [])} tool call(s) went to the model"
        ),
        "turn.retry_scheduled": lambda f: (
            f"a passing fault ({f.get('error')}): retry {f.get('retry')} in {f.get('in_seconds')} s"
        ),
        "turn.input_added": lambda f: f"a {f.get('control')} added: {f.get('text')!r}",
        "turn.cancelled": lambda f: "the turn was cancelled",
        "turn.rolled_back": lambda f: f"rolled back by turn {f.get('by')}: out of the conversation",
        "turn.completed": lambda f: "the turn completed",
        "turn.failed": lambda f: f"the turn failed: {(f.get('error') or {}).get('message')}",
        "history.message": lambda f: f"a {f.get('role')} message (kept by an earlier version)",
        "batch.accepted": lambda f: (
            f"batch {f.get('call_id')} accepted: {f.get('size')} calls of {f.get('tool')}, {f.get('mode')}"
            f" (at most {1 if f.get('mode') == 'ordered' else f.get('limit')} at once), {f.get('on_failure')}"
        ),
        "batch.progress": _batch_progress,
        "turn.delegated": lambda f: (
            f"{_call(f)} started child turn {f.get('child_turn')} of agent "
            f"{(f.get('agent') or {}).get('name')} in thread {f.get('child_thread')}"
        ),
        "tool.delegated": lambda f: (
            f"{_call(f)}: its child turn {f.get('child_turn')} {f.get('child_status')} "
            f"({usage_words(f.get('usage'))})"
        ),
        "tool.child_cancel_requested": lambda f: (
            f"a cancel was asked of child turn {f.get('child_turn')} (control #{f.get('control_id')}): "
            f"{f.get('reason')}"
        ),
        "thread.forked": _forked,
        "turn.webhook_failed": _webhook_failed,
        "thread.rewound": lambda f: f"set back to {f.get('at')}{_snapped(f)}",
    }
    return simple[kind](fact) if kind in simple else kind.replace(".", " ").replace("_", " ")
