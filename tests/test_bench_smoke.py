"""The benchmark harness must not rot: run `python -m bench run --quick` and check its table.

No timed assertions: benchmarks are not tests. Only that the run finishes and writes the rows.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(300)


def _bench(args: list[str], pg_url: str, amqp_url: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m <args>`` in this tree, on the test's services."""
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "BENCH_DATABASE_URL": pg_url, "BENCH_AMQP_URL": amqp_url},
    )


def test_quick_benchmark_writes_the_table(pg_url: str, amqp_url: str, tmp_path: Path) -> None:
    proc = _bench(["bench", "run", "--quick", "--out", str(tmp_path)], pg_url, amqp_url, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = (tmp_path / "RESULTS.md").read_text()
    for metric in (
        "1-call turn p50",
        "added cost of one tool call",
        "tool calls/s, 1 in flight",
        "tool calls/s, 50 in flight",
        "PostgreSQL commits per tool call",
        "Hands kill, safe: re-run p50",
        "Hands kill, unsafe: UNKNOWN p50",
        "Brain kill: standby completes p50",
        "Brain kill mid-step (lease held): standby completes p50",
        "1 MiB result",
        "waiting turns: Brain RSS growth",
        "turns waiting on a signal: turns holding a lease (a run slot)",
        "tool calls/s, 50 in flight as 5 turns of 10 calls",
        "CPU per call, all processes",
        "rows written per tool call",
        "WAL records per tool call",
        "Brain: run moves per transaction (replies, intents, endings), 50 in flight",
        "Hands: events per message, 50 in flight",
        "submit to result applied p50, stretch: submit",
        "submit to result applied p50, stretch: rest",
    ):
        assert metric in table, metric
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["meta"]["failed"] == []
    # The span's stretches were read off both sides' stamps (not a timing: each turn's rest is
    # its span less its submit's stretch, so their medians cannot be the other way round).
    latency = {r["metric"]: r for r in results["rows"] if r["scenario"] == "latency"}
    rest = latency["submit to result applied p50, stretch: rest"]
    assert 0 < rest["tendon"] < latency["submit to result applied p50"]["tendon"], rest
    for key in ("reply", "accept", "outcome"):
        row = latency[f"submit to result applied p50, stretch: {key}"]
        assert row["tendon"] > 0 and row["floor"] > 0, row
    assert latency["submit to result applied p50, stretch: submit"]["floor"] is None
    # The CPU meter found the processes of each role it reports (not a timing: just non-zero).
    cpu = {r["metric"]: r for r in results["rows"] if r["scenario"] == "cpu"}
    for role in ("the Brain", "the Hands (both processes)", "PostgreSQL", "RabbitMQ"):
        row = cpu[f"CPU per call: {role}"]
        assert row["tendon"] is not None and row["tendon"] > 0, row
    assert (cpu["CPU per call: PostgreSQL"]["floor"] or 0) > 0, cpu["CPU per call: PostgreSQL"]
    # ... and what the drain of waiting turns cost, by role (its note names each).
    drained = next(r for r in results["rows"] if r["metric"].endswith("CPU per turn drained, all processes"))
    assert drained["tendon"] > 0, drained
    for role in ("Brain", "Hands", "PostgreSQL", "RabbitMQ"):
        assert role in drained["note"], drained
    assert "quick mode: Celery throughput and latency not run" in table
    assert "quick mode: DBOS not run" in table
    assert "| DBOS | Tendon/DBOS |" in table
    if importlib.util.find_spec("celery") is not None:  # the worker-kill trials run in quick mode
        assert "Celery: whole worker SIGKILL, body again in a 2nd worker p50" in table
        safe = next(line for line in table.splitlines() if "Hands kill, safe: re-run p50" in line)
        assert "(Celery " in safe, safe


def test_the_ab_tool_compares_two_deployments_turn_by_turn_and_under_load(pg_url: str, amqp_url: str) -> None:
    # One tree twice, B with a setting of its own: the tool runs both and prints their medians
    ab = ["bench.ab", ".", ".", "--turns", "2", "--b-env", "TENDON_CONCURRENCY=8"]
    proc = _bench(ab, pg_url, amqp_url, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["p50", "A", "B", "B", "-", "A"], lines
    medians = [line.split() for line in lines[1:9]]
    expected = ["span", "submit", "reply", "accept", "outcome", "rest", "turn", "client"]
    assert [name for name, *_ in medians] == expected, lines  # the span, cut at its commits
    for name, *values in medians:
        assert len(values) == 3 and all(float(v) > 0 for v in values[:2]), (name, values)
    # under load: calls/s and CPU per call of each process, A's and B's windows alternating
    loaded = ["bench.ab", ".", ".", "--load", "4", "--windows", "1", "--seconds", "1"]
    proc = _bench(loaded, pg_url, amqp_url, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line.rsplit(None, 3)[0]: line.split()[-3:] for line in proc.stdout.splitlines()[1:-1]}
    for key in ("calls/s", "Brain", "Hands", "PostgreSQL"):
        assert all(float(v) > 0 for v in rows[key][:2]), (key, proc.stdout)
    # and a tree that is not Tendon's is one line and exit 2, before anything starts
    bad = _bench(["bench.ab", "/nonexistent", "."], pg_url, amqp_url, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0, bad.stderr
    # and a B whose Brain refuses to start is one line and exit 1, with nothing of A left running
    refused = ["bench.ab", ".", ".", "--turns", "2", "--b-env", "TENDON_CONCURRENCY=0"]
    broken = _bench(refused, pg_url, amqp_url, timeout=120)
    assert broken.returncode == 1 and broken.stderr.strip().count("\n") == 0, broken.stderr
    assert broken.stderr.startswith("bench.ab: B did not start: "), broken.stderr
    assert _ab_processes() == [], "a deployment of bench.ab outlived it"


def _ab_processes() -> list[int]:
    """The processes that bench.ab started (their ready files are in its ``tendon-ab-`` dirs)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            text = environ.read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if b"TENDON_READY_FILE=" in text and b"/tendon-ab-" in text:
            found.append(int(environ.parent.name))
    return found
