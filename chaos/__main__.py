"""``python -m chaos run [--quick] [--compose] [--faults N] [--seed N] [--out DIR]``: drive agent
turns through a deployment of Tendon while injecting faults from a seed, and write what happened
(RESULTS.md and a plot).

The deployment is one the run starts on the local services, or, with ``--compose``, a compose
project that runs already (``docker compose up -d --wait``): its containers are then the
processes killed, frozen and restarted, and its turns go through its published API.

Where the report goes: a full run on the local services replaces the published results
(docs/chaos/RESULTS.md); a quick run or a run against a compose project writes to a directory
of its own under .tendon/chaos/, unless ``--out`` says where.

Exit codes: 0 every verdict held; 1 a verdict failed (lost turns, blind re-sends, an UNKNOWN
that could have been settled); 2 bad arguments or services that cannot be used; 130 stopped
(Ctrl-C or SIGTERM: what it started is stopped and removed first)."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import signal
import sys
import tempfile
from pathlib import Path

from bench.harness import REPO, Processes, Services, TendonWorld, delete_amqp
from chaos import report
from chaos.compose import ComposeError, ComposeProject
from chaos.faults import QUICK, SERVICE_RESTARTS, Fault
from chaos.run import Outcome, Shape, run
from chaos.topology import Deployment, local_services

PUBLISHED = REPO / "docs" / "chaos"  # the full run's results, which the docs quote


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
        "--out",
        help="where RESULTS.md goes (default: docs/chaos for a full run on the local services, else a"
        " new directory under .tendon/chaos)",
    )
    r.add_argument(
        "--kinds", help=f"only these fault kinds, comma-separated: {', '.join(f.name.lower() for f in Fault)}"
    )
    c = r.add_argument_group("a compose project (--compose)")
    c.add_argument(
        "--compose",
        action="store_true",
        help="attach to a running compose project instead of starting a deployment: its containers are"
        " the processes to kill, stop and restart",
    )
    c.add_argument("-p", "--project-name", help="the compose project (as `docker compose -p`)")
    c.add_argument("-f", "--file", action="append", default=[], help="a compose file (`docker compose -f`)")
    c.add_argument("--url", help="the project's API (default: where its Brain's port is published)")
    c.add_argument("--token", default=os.environ.get("TENDON_TOKEN"), help="the API's token (TENDON_TOKEN)")
    args = p.parse_args(argv)
    if args.kinds:
        try:
            args.kinds = tuple(Fault[k.strip().upper()] for k in args.kinds.split(",") if k.strip())
        except KeyError as exc:
            p.error(f"no fault kind {exc.args[0].lower()!r}")
    if args.faults is not None and args.faults < 1:
        p.error("--faults must be 1 or more")
    if not args.compose and (args.project_name or args.file or args.url):
        p.error("--project-name, --file and --url go with --compose")
    return args


def invocation(args: argparse.Namespace) -> str:
    """The run's command line, for the report."""
    words = ["python -m chaos run"]
    words += ["--quick"] if args.quick else []
    words += ["--compose"] if args.compose else []
    words += [f"-p {args.project_name}"] if args.project_name else []
    words += [f"-f {f}" for f in args.file]
    words += [f"--faults {args.faults}"] if args.faults else []
    words += [f"--kinds {','.join(k.name.lower() for k in args.kinds)}"] if args.kinds else []
    words += ["--no-restarts"] if args.no_restarts else []
    return " ".join([*words, f"--seed {args.seed}"])


def out_dir(args: argparse.Namespace) -> Path:
    """``--out``, else the published results for a full local run, else a directory of its own."""
    if args.out:
        return Path(args.out)
    if not args.quick and not args.compose:
        return PUBLISHED
    mode = "-".join(m for m, on in (("compose", args.compose), ("quick", args.quick)) if on)
    return REPO / ".tendon" / "chaos" / f"{mode}-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}"


def shape_of(args: argparse.Namespace, kinds: tuple[Fault, ...]) -> Shape:
    count = args.faults or (len(kinds) if args.quick else 240)
    return Shape(faults=count, kinds=kinds, seed=args.seed, settle=60.0 if args.quick else 120.0)


async def on_local_services(args: argparse.Namespace, kinds: tuple[Fault, ...]) -> tuple[Outcome, str]:
    services = Services()
    if (
        not args.quick
        and not args.no_restarts
        and (why := local_services(services.admin_url, services.amqp_url))
    ):
        raise ComposeError(f"cannot restart the services ({'; '.join(why)}); pass --no-restarts")
    shape = shape_of(args, kinds)
    procs = Processes(Path(tempfile.mkdtemp(prefix="tendon-chaos-")))
    await services.create_database()
    world = TendonWorld(services, procs)
    try:
        await world.open()
        out = await run(Deployment(world, shape), shape)
    finally:
        await world.cleanup()
        route = [f"t-{world.suffix}.chaos.{q}" for q in ("commands", "controls")]
        await delete_amqp(services.amqp_url, route + [f"{q}.dlq" for q in route], [])
        procs.stop_all()
        await services.drop_database()
    return out, f"logs in {procs.log_dir}"


async def on_compose(args: argparse.Namespace, kinds: tuple[Fault, ...]) -> tuple[Outcome, str]:
    compose = ["docker", "compose"]
    compose += ["-p", args.project_name] if args.project_name else []
    for f in args.file:
        compose += ["-f", f]
    target = ComposeProject(compose, url=args.url, token=args.token)
    out = await run(target, shape_of(args, kinds))
    return out, f"logs: {' '.join(compose)} logs"


async def main_async(args: argparse.Namespace) -> int:
    # SIGTERM (and SIGINT where a shell ignores it) end the run like Ctrl-C: everything it
    # started is stopped and removed.
    main = asyncio.current_task()
    assert main is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, main.cancel)
    kinds: tuple[Fault, ...] = args.kinds or (QUICK if args.quick else tuple(Fault))
    if args.no_restarts:
        kinds = tuple(k for k in kinds if k not in SERVICE_RESTARTS)
    try:
        out, where = await (on_compose if args.compose else on_local_services)(args, kinds)
    except ComposeError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    out.command = invocation(args)
    path = report.write(out, out_dir(args))
    for what, value, ok in report.verdicts(out):
        print(f"[chaos] {what}: {value}{'' if ok else '  <-- must not be'}")
    print(f"[chaos] wrote {path} ({where})")
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
