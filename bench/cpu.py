"""CPU time per call, by process role, read from ``/proc`` (Linux).

On a saturated machine, calls per second is two cores divided by the CPU time one call costs
across every process that takes part. So the throughput scenario also reports where that CPU
time goes: the Brain, the Hands, PostgreSQL, RabbitMQ, the harness itself (its submits and
status polls for Tendon; the whole floor, which runs in the harness; the Celery client).

A reading sums ``utime + stime`` of every process by role. The shared services are recognised
by process name, all of their processes together (PostgreSQL's backends, its WAL writer...):
during a measured level nothing else runs on them. A meter remembers what it last read of each
process, so a process that exits between two readings still counts with what it had used at the
first (only its last moments are lost) and a reading never goes down: a PostgreSQL backend that
ends during a level (another client's, or a restart's) no longer makes PostgreSQL's share
negative.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")
SERVICES = {"postgres": "PostgreSQL", "beam.smp": "RabbitMQ", "erl_child_setup": "RabbitMQ"}
HARNESS = "harness"


def _stat(pid: int) -> tuple[str, int, float, int] | None:
    """(name, parent pid, user + system CPU seconds, start time) of a live process; None if it is
    gone. The start time tells a process from a later one given the same pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return name, int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS, int(fields[19])


class CpuMeter:
    """``read()`` returns CPU seconds so far by role.

    ``named`` gives the roles of the benchmark's own children (role -> PIDs), asked at every
    reading; a named process's descendants count with it (a Celery worker's prefork
    children). This process is ``harness``.
    """

    def __init__(self, named: Callable[[], Mapping[str, list[int]]] = dict) -> None:
        self.named = named
        self._seen: dict[tuple[int, int], tuple[str, float]] = {}  # (pid, start) -> role, CPU

    def read(self) -> dict[str, float]:
        procs: dict[int, tuple[str, int, float, int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (stat := _stat(int(entry))) is not None:
                procs[int(entry)] = stat
        roles = {pid: SERVICES[name] for pid, (name, _, _, _) in procs.items() if name in SERVICES}
        roles[os.getpid()] = HARNESS
        children: dict[int, list[int]] = {}
        for pid, (_, parent, _, _) in procs.items():
            children.setdefault(parent, []).append(pid)
        for role, pids in self.named().items():
            todo = list(pids)
            while todo:
                pid = todo.pop()
                roles[pid] = role
                todo += children.get(pid, [])
        for pid, role in roles.items():
            if pid in procs:
                _, _, cpu, start = procs[pid]
                self._seen[(pid, start)] = (role, cpu)
        totals: dict[str, float] = {}
        for role, cpu in self._seen.values():
            totals[role] = totals.get(role, 0.0) + cpu
        return totals


def per_call(before: Mapping[str, float], after: Mapping[str, float], calls: float) -> dict[str, float]:
    """Milliseconds of CPU per call by role between two readings (roles in either reading)."""
    if calls <= 0:
        return {}
    return {
        role: 1000.0 * (after.get(role, 0.0) - before.get(role, 0.0)) / calls
        for role in sorted(set(before) | set(after))
    }
