"""How the `brain` command shows what the verbs return: a turn, what it waits for, its history."""

from __future__ import annotations

from typing import Any

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


def print_history(h: dict[str, list[dict[str, Any]]]) -> None:
    """`brain history` for people."""
    print("runs:")
    for r in h["runs"]:
        print(
            f"  run {r['run']} (epoch {r['epoch']}) from {r['began_at']} on {r['owner']}: "
            f"{r['ended'] or 'running'}"
        )
    print("model calls:")
    for c in h["model_calls"]:
        line = f"  #{c['number']} attempt {c['attempt']}: {c['status']}"
        if c["status"] == "replied":
            usage = ", ".join(f"{k} {v}" for k, v in sorted(c["usage"].items()))
            latency = f"{c['latency_ms']} ms" if c.get("latency_ms") is not None else "latency not recorded"
            line += (
                f" in {latency}"
                + (f" by {c['model']}" if c.get("model") else "")
                + (f"; {usage}" if usage else "")
            )
            line += f"; {c['tool_calls']} tool call(s)" if c["tool_calls"] else ""
        elif c["status"] == "failed":
            line += f": {c['error']} (retried after {c['retry_in_seconds']:g}s)"
        else:
            line += ": the Brain making it died; its reply and usage are unknown"
        print(line)
    print(f"steps: {len(h['steps'])} committed")
    for s in h["steps"]:
        print(f"  #{s['seq']} {s['status']}/{s['phase']}: {', '.join(s['facts'])}")
