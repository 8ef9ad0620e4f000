"""How the `brain` command shows what the verbs return: a turn, what it waits for, its history."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from brain.rules.words import latency, usage_words

# What `brain wait` and `brain watch` exit with for a turn that ended (``brain.face.cli`` lists
# every exit code): a cancelled turn neither completed nor failed.
EXIT_BY_END = {"completed": 0, "failed": 1, "cancelled": 7}

RECONCILE_HINT = (
    "resolve each with `hands reconcile EXECUTION_ID --result JSON --evidence TEXT` "
    "(or --failed MESSAGE), or an operator's POST /v1/operator/executions/EXECUTION_ID/reconcile, "
    "once you know what happened"
)


def print_turn(d: dict[str, Any]) -> None:
    """`show` and `wait` for people."""
    print(f"turn {d['turn_id']}  session {d['session_id']}  thread {d['thread']}  request {d['request_id']}")
    print(f"status: {d['status']} (phase {d['phase']}, revision {d['revision']}, {d['runs']} run(s))")
    if d["waiting_for"] and d["status"] in ("waiting", "paused"):
        print(f"waiting for: {d['waiting_for']}")
    if d["error"]:
        print(f"error: {d['error'].get('code')}: {d['error'].get('message')}")
    if d["executions"]:
        print("executions:")
        for e in d["executions"]:
            how = f" ({e['how']})" if e["how"] else ""
            print(f"  {e['call_id']:<8} {e['tool']:<16} {e['status']:<10}{how}  {e['id']}")
            if e["evidence"]:
                print(f"           evidence: {e['evidence']}")
            if e["status"] != "succeeded" and e["error"]:
                print(f"           {e['error'].get('code')}: {e['error'].get('message')}")
    if d["result"]:
        print("result:")
        print("  " + str(d["result"].get("text")).replace("\n", "\n  "))


def waiting_line(d: dict[str, Any]) -> str:
    """One line saying what a waiting turn waits for (and, for a reconcile, how to give it)."""
    line = f"turn {d['turn_id']} waits for {d['waiting_for'] or 'its tools'}"
    if (d["waiting_for"] or "").startswith("reconcile"):
        line += f"; {RECONCILE_HINT}"
    return line


def clock(at: str | None) -> str:
    """An ISO timestamp as the local time of day, to the millisecond (blank when unknown)."""
    if not at:
        return " " * 12
    return datetime.fromisoformat(at).astimezone().strftime("%H:%M:%S.%f")[:-3]


def _began(h: dict[str, list[dict[str, Any]]]) -> str:
    first = next((s["at"] for s in h["steps"] if s.get("at")), None)
    if first is None:
        return ""
    moment = datetime.fromisoformat(first).astimezone()
    return f" (local times, {moment:%Z %z}; the turn began {moment:%Y-%m-%d %H:%M:%S})"


def _model_call(c: dict[str, Any]) -> str:
    line = f"  {clock(c.get('at'))}  #{c['number']} attempt {c['attempt']}: "
    if c["status"] == "replied":
        used = usage_words(c["usage"])
        line += f"replied in {latency(c.get('latency_ms'))}" + (f" by {c['model']}" if c.get("model") else "")
        line += (f" ({used})" if used else "") + (
            f"; asked for {c['tool_calls']} tool call(s)" if c["tool_calls"] else ""
        )
    elif c["status"] == "failed":
        line += f"failed: {c['error']} (retried after {c['retry_in_seconds']:g} s)"
    else:
        line += "LOST: the Brain making it died; its reply and usage are unknown"
    return line


def print_history(h: dict[str, Any]) -> None:
    """`brain history` for people: each run, model call and committed step with its time, the steps
    in words."""
    print("runs" + _began(h) + ":")
    for r in h["runs"]:
        print(
            f"  {clock(r.get('at'))}  run {r['run']} (epoch {r['epoch']}) began at phase {r['began_at']} on "
            f"{r['owner']}: {r['ended'] or 'running'}"
        )
    print("model calls:")
    for c in h["model_calls"]:
        print(_model_call(c))
    for line in _children(h.get("children") or []):
        print(line)
    if h.get("usage"):
        print(f"usage{', children included' if h.get('children') else ''}: {_usage(h['usage'])}")
    print(f"steps ({len(h['steps'])} committed, each a journal entry):")
    for s in h["steps"]:
        said = s.get("said") or s["facts"]
        print(f"  {clock(s.get('at'))}  #{s['seq']:<4} {s['status']}/{s['phase']}: {'; '.join(said)}")


def _usage(usage: dict[str, Any]) -> str:
    return ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in usage.items())


def _children(children: list[dict[str, Any]], depth: int = 1) -> list[str]:
    """A turn's delegated calls, each with its child turn, thread and cost (its children's too)."""
    lines = ["delegated:"] if depth == 1 and children else []
    for c in children:
        where = f"turn {c['child_turn']} in thread {c['child_thread']}" if c["child_turn"] else "no child"
        end = c["child_status"] or c["status"]
        cost = f": {_usage(c['usage'])}" if c["usage"] else ""
        why = f" ({c['reason']})" if c.get("reason") else ""
        call = f"{c['tool']} {c['call_id']} -> agent {c['agent']['name']}"
        lines.append(f"{'  ' * depth}{call}, {where}, {end}{why}{cost}")
        lines += _children(c.get("children") or [], depth + 1)
    return lines
