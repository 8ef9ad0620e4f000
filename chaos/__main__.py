"""``python -m chaos run [--quick] [--faults N] [--seed N] [--out DIR]``: start a topology of
Brains and Hands pools on the local services, drive agent turns through it while injecting
faults from a seed, and write what happened (docs/chaos/RESULTS.md).

Exit codes: 0 every verdict held; 1 a verdict failed (lost turns, blind re-sends, an UNKNOWN
that could have been settled); 2 bad arguments or services that cannot be used; 130 stopped
(Ctrl-C or SIGTERM: what it started is stopped and removed first)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
from pathlib import Path

from bench.harness import REPO, Processes, Services, TendonWorld, delete_amqp
from chaos import report
from chaos.faults import QUICK, SERVICE_RESTARTS, Fault
from chaos.run import Shape, run
from chaos.topology import local_services


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="chaos", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the faults and write RESULTS.md")
    r.add_argument(
        "--quick", action="store_true", help="one fault of each kind that leaves the services up (~1 min)"
    )
    r.add_argument(
        "--faults", type=int, default=None, help="how many faults (default 240, quick: one per kind)"
    )
    r.add_argument("--seed", type=int, default=1, help="the seed of the fault order and targets (default 1)")
    r.add_argument(
        "--no-restarts", action="store_true", help="never restart PostgreSQL or RabbitMQ themselves"
    )
    r.add_argument(
        "--out", default=str(REPO / "docs" / "chaos"), help="where RESULTS.md goes (default docs/chaos)"
    )
    r.add_argument(
        "--kinds", help=f"only these fault kinds, comma-separated: {', '.join(f.name.lower() for f in Fault)}"
    )
    args = p.parse_args(argv)
    if args.kinds:
        try:
            args.kinds = tuple(Fault[k.strip().upper()] for k in args.kinds.split(",") if k.strip())
        except KeyError as exc:
            p.error(f"no fault kind {exc.args[0].lower()!r}")
    if args.faults is not None and args.faults < 1:
        p.error("--faults must be 1 or more")
    return args


async def main_async(args: argparse.Namespace) -> int:
    # SIGTERM (and SIGINT where a shell ignores it) end the run like Ctrl-C: everything it
    # started is stopped and removed.
    main = asyncio.current_task()
    assert main is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, main.cancel)
    services = Services()
    kinds: tuple[Fault, ...] = args.kinds or (QUICK if args.quick else tuple(Fault))
    if (
        not args.quick
        and not args.no_restarts
        and (why := local_services(services.admin_url, services.amqp_url))
    ):
        print(f"chaos: cannot restart the services ({'; '.join(why)}); pass --no-restarts", file=sys.stderr)
        return 2
    if args.no_restarts:
        kinds = tuple(k for k in kinds if k not in SERVICE_RESTARTS)
    count = args.faults or (len(kinds) if args.quick else 240)
    shape = Shape(faults=count, kinds=kinds, seed=args.seed, settle=60.0 if args.quick else 120.0)
    procs = Processes(Path(tempfile.mkdtemp(prefix="tendon-chaos-")))
    await services.create_database()
    world = TendonWorld(services, procs)
    try:
        await world.open()
        out = await run(world, shape)
    finally:
        await world.cleanup()
        route = [f"t-{world.suffix}.chaos.{q}" for q in ("commands", "controls")]
        await delete_amqp(services.amqp_url, route + [f"{q}.dlq" for q in route], [])
        procs.stop_all()
        await services.drop_database()
    path = report.write(out, Path(args.out))
    for what, value, ok in report.verdicts(out):
        print(f"[chaos] {what}: {value}{'' if ok else '  <-- must not be'}")
    print(f"[chaos] wrote {path} (logs in {procs.log_dir})")
    return 0 if report.passed(out) else 1


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        return asyncio.run(main_async(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("chaos: stopped; what it started is gone", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
