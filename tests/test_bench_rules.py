"""The benchmark's own rules, without servers: a slow machine gets honest figures, never missing rows.

A fake world stands in for Tendon: its turns complete only after a number of status looks that
a short measuring window cannot reach (the closed loop sleeps 10 ms between looks), whatever the
machine's speed. No timed assertions: benchmarks are not tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from bench.cpu import HARNESS, CpuMeter, per_call
from bench.scenarios.base import Row
from bench.scenarios.latency import stretch_rows
from bench.scenarios.throughput import WIDE_NAME, Level, cpu_rows, median_cpu, tendon_closed_loop

ROLES = ("Brain", "Hands", "PostgreSQL", "RabbitMQ", HARNESS)
WINDOW = 0.05  # s: at most 6 status looks at one every 10 ms
LOOKS = 20  # a fake turn completes at its 20th status look: never inside WINDOW


class SlowWorld:
    """Turns that take ``looks`` status looks to complete (``None``: never)."""

    def __init__(self, looks: int | None = LOOKS) -> None:
        self.looks = looks
        self.seen: dict[str, int] = {}
        self.submitted: list[dict[str, Any]] = []

    async def submit(self, definition: dict[str, Any]) -> str:
        self.submitted.append(definition)
        tid = f"t{len(self.submitted)}"
        self.seen[tid] = 0
        return tid

    async def statuses(self, ids: list[str]) -> dict[str, str]:
        out = {}
        for tid in ids:
            self.seen[tid] += 1
            done = self.looks is not None and self.seen[tid] >= self.looks
            out[tid] = "completed" if done else "running"
        return out

    async def wait_done(self, ids: list[str], timeout: float, interval: float = 0.005) -> None:
        """The drain: every turn the loop left in flight completes."""
        for tid in ids:
            self.seen[tid] = LOOKS


class StepMeter(CpuMeter):
    """Each reading adds one CPU second to every role."""

    def __init__(self) -> None:
        super().__init__()
        self.readings = 0

    def read(self) -> dict[str, float]:
        self.readings += 1
        return dict.fromkeys(ROLES, float(self.readings))


@pytest.mark.parametrize(("in_flight", "calls_per_turn"), [(3, 1), (10, 5)])
async def test_a_window_shorter_than_a_turn_still_gives_a_rate_and_the_cpu_of_every_role(
    in_flight: int, calls_per_turn: int
) -> None:
    # Given turns that outlast the measuring window (a loaded machine)
    world, meter = SlowWorld(), StepMeter()

    # When a closed loop measures them
    level = await tendon_closed_loop(world, in_flight, WINDOW, calls_per_turn=calls_per_turn, meter=meter)

    # Then the window waited for a round of calls: the level has a rate and a CPU split
    assert meter.readings == 2
    assert sorted(level.cpu) == sorted(ROLES)
    calls = 1000.0 / level.cpu["Brain"]  # one CPU second per role between the two readings
    assert calls >= in_flight
    assert level.rate == pytest.approx(calls / level.seconds)
    assert all(ms > 0 for ms in level.cpu.values())


async def test_a_window_that_never_sees_a_call_complete_raises_with_what_it_waited_for() -> None:
    with pytest.raises(TimeoutError, match="0 of the 3 calls"):
        await tendon_closed_loop(SlowWorld(looks=None), 3, WINDOW, meter=StepMeter(), timeout=0.2)


async def test_a_failed_turn_fails_the_level() -> None:
    class FailingWorld(SlowWorld):
        async def statuses(self, ids: list[str]) -> dict[str, str]:
            return dict.fromkeys(ids, "failed")

    with pytest.raises(RuntimeError, match="did not complete"):
        await tendon_closed_loop(FailingWorld(), 2, WINDOW)


FLOOR = {"PostgreSQL": 1.0, "RabbitMQ": 0.7, HARNESS: 1.5}
TENDON = {"Brain": 6.0, "Hands": 4.3, "PostgreSQL": 8.3, "RabbitMQ": 2.8, HARNESS: 1.1}


def by_metric(rows: list[Row]) -> dict[str, Row]:
    return {r.metric: r for r in rows}


def test_cpu_rows_of_every_tendon_role_are_written_with_their_figures() -> None:
    rows = by_metric(cpu_rows({"Tendon": TENDON, WIDE_NAME: TENDON, "floor": FLOOR}, celery_ok=False))

    assert rows["CPU per call: the Brain"].tendon == 6.0
    assert rows["CPU per call: PostgreSQL"].floor == 1.0
    assert rows["CPU per call, all processes"].tendon == pytest.approx(sum(TENDON.values()))
    assert "CPU per call: the Celery worker (prefork children included)" not in rows  # Celery did not run
    assert not any("not measured" in r.note for r in rows.values())


def test_a_tendon_level_without_a_cpu_split_keeps_its_rows_and_says_not_measured() -> None:
    rows = by_metric(cpu_rows({"Tendon": {}, WIDE_NAME: {}, "floor": FLOOR}, celery_ok=False))

    for label in ("the Brain", "the Hands (both processes)", "PostgreSQL", "RabbitMQ", "the harness process"):
        row = rows[f"CPU per call: {label}"]
        assert row.tendon is None
        assert "not measured: Tendon" in row.note, label
    assert rows["CPU per call: PostgreSQL"].floor == 1.0
    assert "not measured: Tendon" in rows["CPU per call, all processes"].note


def test_a_celery_run_without_worker_figures_says_not_measured() -> None:
    rows = by_metric(
        cpu_rows({"Tendon": TENDON, "floor": FLOOR, "Celery": {"RabbitMQ": 1.0}}, celery_ok=True)
    )

    worker = rows["CPU per call: the Celery worker (prefork children included)"]
    assert worker.celery is None
    assert "not measured: Celery" in worker.note


def test_the_median_of_a_role_counts_only_the_repeats_that_measured_it() -> None:
    levels = [Level(80.0, {"Brain": 6.0}), Level(0.0), Level(82.0, {"Brain": 8.0})]

    assert median_cpu(levels) == {"Brain": 7.0}


def test_batch_sizes_are_read_from_the_processes_shutdown_lines(tmp_path: Any) -> None:
    from bench.scenarios.batches import batch_lines, summarize

    brain = tmp_path / "brain.log"
    brain.write_text(
        "not json\n"
        + json.dumps(
            {"event": "batch_sizes", "stats": json.dumps({"committer": "moves", "sizes": {"1": 4, "3": 2}})}
        )
        + "\n"
        + json.dumps(
            {
                "event": "batch_sizes",
                "stats": json.dumps({"committer": "claims", "sizes": {"0": 5, "2": 1}}),
                "command_messages": 4,
                "commands": 14,
            }
        )
        + "\n"
    )
    hands = tmp_path / "hands.log"
    hands.write_text(
        json.dumps(
            {
                "event": "batch_sizes",
                "stats": json.dumps({"committer": "ledger", "sizes": {"2": 3}}),
                "messages": 4,
                "events": 10,
            }
        )
        + "\n"
    )
    got = summarize(batch_lines([brain, hands]))
    # moves: 10 items in 6 transactions; claims that took nothing are not batches; no updates or
    # submits seen
    assert got == {
        "moves": 10 / 6, "claims": 2.0, "ledger": 2.0, "updates": None, "submits": None,
        "events per message": 2.5, "commands per message": 3.5,
    }  # fmt: skip


def test_a_process_that_exits_between_two_readings_never_makes_its_role_use_less_cpu() -> None:
    # Given a process of a role that has used some CPU (a backend of a service, say)
    burn = (
        "import time\nend = time.process_time() + 0.1\nwhile time.process_time() < end: pass\ntime.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", burn])
    try:
        meter = CpuMeter(lambda: {"backend": [child.pid]})
        deadline = time.monotonic() + 30
        while meter.read().get("backend", 0.0) < 0.05 and time.monotonic() < deadline:
            time.sleep(0.05)
        before = meter.read()
        # When it exits before the next reading
        child.kill()
        child.wait()
        after = meter.read()
    finally:
        child.kill()
        child.wait()
    # Then the role keeps what it had used: no share goes below zero
    assert before["backend"] >= 0.05
    assert after["backend"] == before["backend"]
    assert all(ms >= 0 for ms in per_call(before, after, 1).values())


def test_the_span_is_cut_into_a_row_per_stretch_with_the_floor_beside_it_where_it_has_one() -> None:
    cuts = {
        "submit": [0.001, 0.003, 0.002],
        "reply": [0.002],
        "accept": [0.001],
        "outcome": [0.002],
        "rest": [0.005],
    }
    floor = {"reply": [0.0015], "accept": [0.0005], "outcome": [0.0015], "rest": [0.004]}
    rows = {r.metric.rsplit(": ", 1)[-1]: r for r in stretch_rows(cuts, floor)}

    assert list(rows) == ["submit", "reply", "accept", "outcome", "rest"]
    assert rows["submit"].tendon == pytest.approx(2.0) and rows["submit"].floor is None
    assert rows["rest"].tendon == pytest.approx(5.0) and rows["rest"].floor == pytest.approx(4.0)
    assert "has none" in rows["submit"].note and "whole span" in rows["rest"].note


def test_a_stretch_without_figures_has_no_row() -> None:
    rows = stretch_rows({"reply": [0.002]}, {})

    assert [r.metric for r in rows] == ["submit to result applied p50, stretch: reply"]
    assert rows[0].floor is None
