"""``python -m bench.statements``: SQL statements per 1-call turn, by statement, all processes.

Every statement is a round trip (see docs/benchmarks/NOTES.md, the third and fifth rounds). This
runs a Brain and a Hands pool of 2 in a database of its own with ``log_statement = 'all'`` set on
that database only, keeps ``--in-flight`` 1-call turns going for ``--seconds``, and counts the statements
PostgreSQL logged for it, per completed turn. With ``--durations`` it sets
``log_min_duration_statement = 0`` instead and also sums the server's time per statement (its
parse, bind and execute steps; wall time, so a statement that waits for a lock or for its
commit's WAL flush counts that wait). It reads the server's log file, so it runs on the
database's own machine (``--log``, default: the Debian cluster log). The harness's own submits
and status polls are included (the submit is Tendon's code; the polls are marked in the table).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import sys
import tempfile
from pathlib import Path

import asyncpg

from bench.harness import Processes, Services, TendonWorld
from bench.scenarios.throughput import tendon_closed_loop

DEFAULT_LOG = "/var/log/postgresql/postgresql-15-main.log"


async def count(
    log: Path, in_flight: int, seconds: float, *, durations: bool = False
) -> tuple[int, collections.Counter[str], dict[str, float]]:
    """(completed turns, statements by their first 100 characters, milliseconds by the same
    key) over one closed loop; the milliseconds only with ``durations``."""
    procs = Processes(Path(tempfile.mkdtemp(prefix="tendon-statements-")))
    services = Services()
    await services.create_database()
    setting = "log_min_duration_statement = 0" if durations else "log_statement = 'all'"
    conn = await asyncpg.connect(services.admin_url)
    try:
        await conn.execute(f'ALTER DATABASE "{services.dbname}" SET {setting}')
    finally:
        await conn.close()
    world = TendonWorld(services, procs)
    try:
        await world.start_brain()
        await world.start_hands()
        await world.start_hands()
        await world.open()
        await tendon_closed_loop(world, 4, 1.0)  # warm up: bindings, caches, prepared statements
        done = "SELECT count(*) AS n FROM turns WHERE status = 'completed'"
        before, offset = (await world.fetch(done))[0]["n"], log.stat().st_size
        await tendon_closed_loop(world, in_flight, seconds)
        after, end = (await world.fetch(done))[0]["n"], log.stat().st_size
    finally:
        await world.cleanup()
        procs.stop_all()
        await services.drop_database()
    with log.open("rb") as f:
        f.seek(offset)
        text = f.read(end - offset).decode(errors="replace")
    counts: collections.Counter[str] = collections.Counter()
    millis: dict[str, float] = collections.defaultdict(float)
    if durations:
        # One line per protocol step over the threshold (0): parse, bind, execute, or a
        # simple-protocol statement; a statement is counted once, at its execute.
        pattern = (
            rf"@{services.dbname} LOG:  duration: ([\d.]+) ms  (parse|bind|execute|statement)"
            rf"[^:]*: (.*?)(?=\n\d{{4}}-\d\d-\d\d |\Z)"
        )
        for m in re.finditer(pattern, text, re.S):
            key = " ".join(m.group(3).split())[:100]
            millis[key] += float(m.group(1))
            if m.group(2) in ("execute", "statement"):
                counts[key] += 1
    else:
        pattern = rf"@{services.dbname} LOG:  (?:statement|execute [^:]*): (.*?)(?=\n\d{{4}}-\d\d-\d\d |\Z)"
        counts.update(" ".join(m.group(1).split())[:100] for m in re.finditer(pattern, text, re.S))
    return after - before, counts, millis


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.statements", description=__doc__)
    p.add_argument("--log", default=DEFAULT_LOG, help=f"PostgreSQL's log file (default {DEFAULT_LOG})")
    p.add_argument("--in-flight", type=int, default=10, help="turns kept in flight (default 10)")
    p.add_argument("--seconds", type=float, default=3.0, help="how long to measure (default 3)")
    p.add_argument("--top", type=int, default=40, help="statements to list (default 40)")
    p.add_argument(
        "--durations", action="store_true", help="also the server's milliseconds per statement per turn"
    )
    args = p.parse_args()
    log = Path(args.log)
    if not log.exists():
        print(f"no PostgreSQL log at {log}: pass --log PATH", file=sys.stderr)
        return 2
    turns, counts, millis = asyncio.run(count(log, args.in_flight, args.seconds, durations=args.durations))
    if turns == 0 or not counts:
        print("no turn completed or nothing was logged: is log_statement allowed here?", file=sys.stderr)
        return 1
    total = sum(counts.values())
    print(f"{turns} turns, {total} statements: {total / turns:.1f} per turn ({args.in_flight} in flight)")
    if args.durations:
        print(f"server time: {sum(millis.values()) / turns:.2f} ms per turn")
        print("| ms per turn | per turn | statement |\n| ---: | ---: | --- |")
        for sql, ms in sorted(millis.items(), key=lambda kv: -kv[1])[: args.top]:
            mark = " (harness poll)" if sql.startswith("SELECT id, status FROM turns") else ""
            print(f"| {ms / turns:.3f} | {counts[sql] / turns:.2f} | `{sql}`{mark} |")
        return 0
    print("| per turn | statement |\n| ---: | --- |")
    for sql, n in counts.most_common(args.top):
        mark = " (harness poll)" if sql.startswith("SELECT id, status FROM turns") else ""
        print(f"| {n / turns:.2f} | `{sql}`{mark} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
