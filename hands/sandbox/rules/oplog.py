"""The operation log a command leaves inside its sandbox, so that its result outlives the worker
that started it (DESIGN invariant 18).

Every command of an execution runs under a small wrapper shell, in the sandbox, that keeps its
record in ``.tendon/ops/<op>/``:

    cmd    the command line, written before the wrapper starts
    lock/  made by the wrapper with ``mkdir``, atomically: the command starts once per op, ever;
           a second wrapper for the same op (a worker that re-attaches, a start sent twice)
           finds it and leaves
    pid    the wrapper's process id, while it waits for the command
    child  the command's process id (what a cancel signals)
    out    the command's standard output and error, as they come
    exit   its exit code, written (atomically, by a rename) once it ended

A worker that died leaves the wrapper running; the next one reads the log: finished (an exit
code and the whole output), still running (it follows it to its end), never started (no lock:
starting it now is its first run), or lost (a lock, no exit, and no wrapper alive: the sandbox
was stopped under it), which nothing can settle but a reconcile, or a re-run of a command the
agent marked idempotent. ``<op>`` is the execution id (``<execution id>.<n>`` for the n-th run
of an idempotent command after a loss).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from enum import StrEnum

OPS = ".tendon/ops"
TIMED_OUT = 124  # what ``timeout`` exits with when the time ran out
STARTING_GRACE = 10.0  # seconds a lock may stand without a pid before the wrapper counts as lost


def op_dir(op: str) -> str:
    return f"{OPS}/{op}"


def wrapper(op: str, timeout: float) -> str:
    """The wrapper's script (``run.sh``): start once, record pid, output and exit code. ``timeout``
    ends the command (TERM, then KILL 5 s later) in the sandbox itself, with no worker needed."""
    d = shlex.quote(op_dir(op))
    return f"""#!/bin/sh
# tendon sandbox operation {op}
d={d}
mkdir "$d/lock" 2>/dev/null || exit 0
echo $$ > "$d/pid.tmp" && mv "$d/pid.tmp" "$d/pid"
timeout -k 5 {max(1, int(timeout))} sh "$d/cmd" > "$d/out" 2>&1 < /dev/null &
echo $! > "$d/child"
wait $!
echo $? > "$d/exit.tmp" && mv "$d/exit.tmp" "$d/exit"
"""


def launch(op: str) -> str:
    """Starts the wrapper detached from whoever asked (its own session where ``setsid`` exists),
    so it outlives the worker; returns at once."""
    run = shlex.quote(f"{op_dir(op)}/run.sh")
    return (
        f"if command -v setsid >/dev/null 2>&1; then setsid sh {run} </dev/null >/dev/null 2>&1 & "
        f"else nohup sh {run} </dev/null >/dev/null 2>&1 & fi"
    )


def probe(op: str) -> str:
    """A script printing one line of what the log says: ``none``, ``exit N``, ``running`` (the
    wrapper lives: its pid, not a zombie, and its command line names the op), ``starting`` (a
    lock, no pid yet), ``fenced`` (a follower took the lock: it never ran) or ``lost``; then ``size
    N`` of the output so far.

    The wrapper is looked at *before* its exit file: one that ended between the two looks has
    written its exit code by then, so an end is never taken for a loss."""
    d = shlex.quote(op_dir(op))
    name = shlex.quote(op)
    return f"""d={d}
if [ ! -d "$d/lock" ]; then echo none
elif [ -f "$d/lock/fenced" ]; then echo fenced
else
  state=starting
  if [ -f "$d/pid" ]; then
    p=$(cat "$d/pid"); state=lost
    if [ -r "/proc/$p/stat" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$p/stat" 2>/dev/null \\
       && tr '\\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -qF -- {name}; then state=running; fi
  fi
  if [ -f "$d/exit" ]; then echo "exit $(cat "$d/exit")"; else echo "$state"; fi
fi
if [ -f "$d/out" ]; then echo "size $(wc -c < "$d/out")"; else echo "size 0"; fi
"""


def fence(op: str) -> str:
    """Takes the op's lock where no wrapper did: prints ``fenced`` when it took it (the command
    can never start now), nothing when a wrapper holds it."""
    lock = shlex.quote(f"{op_dir(op)}/lock")
    return f"mkdir {lock} 2>/dev/null && : > {lock}/fenced && echo fenced; true"


def stop(op: str, signal: str = "TERM") -> str:
    """A cancel: ``signal`` to the command's process group (``timeout`` leads one: the command and
    everything it started). Harmless before the command started or after it ended."""
    child = shlex.quote(f"{op_dir(op)}/child")
    return f'[ -f {child} ] && kill -s {signal} -- "-$(cat {child})" 2>/dev/null; true'


class Phase(StrEnum):
    NONE = "none"  # never started: no wrapper ever took the lock
    FENCED = "fenced"  # never started, and never will: a follower took the lock in its stead
    STARTING = "starting"
    RUNNING = "running"
    FINISHED = "finished"
    LOST = "lost"


@dataclass(frozen=True)
class OpState:
    phase: Phase
    size: int = 0
    exit_code: int | None = None


def read_probe(text: str) -> OpState:
    """What :func:`probe` printed, as an :class:`OpState` (ValueError for anything else)."""
    lines = text.split()
    if len(lines) < 3 or lines[-2] != "size":
        raise ValueError(f"the operation log's probe answered {text!r:.200}")
    size = int(lines[-1])
    if lines[0] == "exit":
        return OpState(Phase.FINISHED, size, int(lines[1]))
    return OpState(Phase(lines[0]), size)


def outcome(state: OpState, tail: str, *, cancelled: bool = False) -> dict[str, object]:
    """The execution's result for a finished command: exit code, whether the time ran out, how
    much output it wrote (every byte is in the output pages) and the end of it."""
    assert state.exit_code is not None
    return {
        "exit_code": state.exit_code,
        "timed_out": state.exit_code == TIMED_OUT and not cancelled,
        "output_bytes": state.size,
        "output": tail,
    }
