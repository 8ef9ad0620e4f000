"""Run the scenarios, write the report:
``python -m bench run [--quick] [--out DIR] [--only a,b] [--submit api|sql] [--waiting N]``."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import sys
import tempfile
import time
import traceback
from pathlib import Path

from bench import report
from bench.harness import REPO, Processes, Services
from bench.scenarios.base import Context, Row
from infra.process.entry import run_async

SCENARIOS = ["latency", "throughput", "batches", "cost", "recovery", "payload", "waiting", "signals", "ttft"]


async def main_async(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    procs = Processes(Path(tempfile.mkdtemp(prefix="tendon-bench-")))  # logs and gate files
    services = Services(submit_over=args.submit)
    only = [s for s in (args.only or ",".join(SCENARIOS)).split(",") if s]
    ctx = Context(services, procs, args.quick, out, waiting=args.waiting)
    rows: list[Row] = []
    series: dict = {}
    failed: list[str] = []
    started, t0 = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), time.monotonic()
    await services.create_database()
    try:
        if {"payload"} & set(only):
            services.start_s3(procs)
        for name in only:
            print(f"[bench] {name} ...", flush=True)
            t = time.monotonic()
            try:
                mod = importlib.import_module(f"bench.scenarios.{name}")
                res = await mod.run(ctx)
            except Exception as exc:  # noqa: BLE001 - a failed scenario is reported, the run goes on
                traceback.print_exc()
                failed.append(name)
                ctx.notes.append(f"scenario `{name}` FAILED: {type(exc).__name__}: {exc}")
                continue
            rows += res.rows
            series.update(res.series)
            print(f"[bench] {name} done in {time.monotonic() - t:.1f}s", flush=True)
    finally:
        procs.stop_all()
        await services.drop_database()
    meta = {
        "mode": "quick" if args.quick else "full",
        "started": started,
        "seconds": time.monotonic() - t0,
        "scenarios": only,
        "failed": failed,
        "submit": args.submit,
    }
    path = report.write(out, rows, series, ctx.notes, meta)
    print(report.table(rows))
    for note in ctx.notes:
        print(f"note: {note}")
    print(f"[bench] wrote {path}")
    return 1 if failed else 0


def main() -> int:
    p = argparse.ArgumentParser(prog="bench", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the scenarios and write docs/benchmarks/")
    r.add_argument("--quick", action="store_true", help="small repeats, no extra packages (< 2 min)")
    r.add_argument("--out", default=str(REPO / "docs" / "benchmarks"), help="output directory")
    r.add_argument("--only", help=f"comma-separated subset of {','.join(SCENARIOS)}")
    r.add_argument(
        "--submit",
        choices=["api", "sql"],
        default="api",
        help="submit turns to the Brain's HTTP API (default; it may start a turn in the submit's commit) "
        "or straight into the database",
    )
    r.add_argument(
        "--waiting",
        type=int,
        metavar="N",
        help="turns the waiting and signals scenarios park (default 50 quick, 10000 full)",
    )
    args = p.parse_args()
    if args.waiting is not None and args.waiting < 1:
        p.error("--waiting takes a number of turns, at least 1")
    return run_async(main_async(args))  # the floor runs here: on the loop Tendon runs on


if __name__ == "__main__":
    sys.exit(main())
