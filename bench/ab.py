"""``python -m bench.ab A B``: does change B make a lone turn faster than A? Two deployments
(a Brain and a Hands process each, from work trees A and B, or from one tree twice with other
settings for B) serve alternate lone 1-call turns, and the latency headline's span (submit to
result applied) is compared, cut into its stretches (from one transaction on the span to the next),
with the whole turn and the client-observed time beside it.

With ``--load K`` it compares throughput instead: each deployment gets a second Hands process (as
the throughput scenario's), and the two take turns keeping K calls in flight for a few seconds
at a time; it prints the median calls/s and CPU ms per call by process over those windows.

Why turn by turn: this host's speed moves from second to second. One tree's median over 250 lone
turns moved from 6.1 to 7.3 ms between two runs of the same code, and from 5.8 to 7.8 ms between
the quarters of one run, so runs one after another (even alternating, as the latency scenario's
blocks do) resolve only large differences. Served turn by turn, A and B meet the host alike: a
tree against itself differed by 0.14 ms over 400 turns each. Not a test and not the benchmark:
a tool for deciding whether a change to the hot path is worth keeping.

Exit status: 0 with the table; 2 for bad arguments; 1 when a deployment did not start (one line
says which, why and where its logs are; nothing of either deployment is left running).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.cpu import CpuMeter
from bench.harness import Processes, Services, TendonWorld, one_call_agent
from bench.scenarios.throughput import tendon_closed_loop

WARM_UP = 30  # turns per deployment before the measured ones: bindings, caches, connections
LOAD_SECONDS = 6.0  # a --load window: long enough for batches to settle, short enough to alternate


class NotStarted(Exception):
    """A deployment did not start (a Brain or Hands process exited, or was not ready in time)."""


async def _world(
    label: str, tree: Path, services: Services, extra: dict[str, str], hands: int
) -> TendonWorld:
    """A deployment of ``tree``; one that does not start is stopped and cleaned up at once (no
    process of it is left running) and raises ``NotStarted`` with the last line of the reason."""
    world = TendonWorld(services, Processes(Path(tempfile.mkdtemp(prefix="tendon-ab-")), tree), extra)
    try:
        await world.start_brain()
        for _ in range(hands):
            await world.start_hands()
        await world.open()
    except Exception as exc:
        world.procs.stop_all()
        await world.cleanup()
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        raise NotStarted(f"{label} did not start: {why} (its logs: {world.procs.log_dir})") from exc
    return world


async def compare(
    trees: tuple[Path, Path],
    extra_b: dict[str, str],
    turns: int,
    load: int = 0,
    windows: tuple[int, float] = (0, LOAD_SECONDS),
) -> list[dict[str, float]]:
    """Medians for A and B: in ms (span, turn, client) over ``turns`` lone turns each, or with
    ``load``, calls/s and CPU ms per call by process over ``windows`` (how many, seconds) each."""
    services = Services()
    await services.create_database()
    worlds: list[TendonWorld] = []
    try:
        hands = 2 if load else 1
        worlds.append(await _world("A", trees[0], services, {}, hands))  # cleaned up below if B fails
        worlds.append(await _world("B", trees[1], services, extra_b, hands))
        if load:
            return await _loaded(worlds, load, windows)
        agent = one_call_agent("noop", calls=1)
        for world in worlds:
            for _ in range(WARM_UP):
                await world.call(agent, timeout=30)
            await world.settle()
        ids: list[list[str]] = [[], []]
        client: list[list[float]] = [[], []]
        for i in range(turns):
            for side in (0, 1) if i % 2 == 0 else (1, 0):  # neither always goes first
                t0 = time.perf_counter()
                ids[side].append(await worlds[side].call(agent, timeout=30))
                client[side].append(time.perf_counter() - t0)
        found = []
        for side, world in enumerate(worlds):
            span = await world.result_applied_latencies(ids[side])
            whole = await world.server_latencies(ids[side])
            cuts = await world.stretches(ids[side])
            found.append(
                {
                    "span": 1000 * statistics.median(span),
                    **{f"  {key}": 1000 * statistics.median(values) for key, values in cuts.items()},
                    "turn": 1000 * statistics.median(whole),
                    "client": 1000 * statistics.median(client[side]),
                }
            )
        return found
    finally:
        for world in worlds:
            await world.cleanup()
            world.procs.stop_all()
        await services.drop_database()


async def _loaded(worlds: list[TendonWorld], load: int, windows: tuple[int, float]) -> list[dict[str, float]]:
    """Medians of calls/s and CPU ms per call by process, each world's windows taking turns."""
    for world in worlds:
        await tendon_closed_loop(world, 4, 1.0)  # warm up
        await world.settle()
    found: list[dict[str, list[float]]] = [{}, {}]
    count, seconds = windows
    for i in range(count):
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            meter = CpuMeter(worlds[side].roles)
            level = await tendon_closed_loop(worlds[side], load, seconds, meter=meter)
            for key, value in {"calls/s": level.rate, **level.cpu}.items():
                found[side].setdefault(key, []).append(value)
    return [{key: statistics.median(values) for key, values in side.items()} for side in found]


def _setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, not {text!r}")
    return name, value


def main() -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.ab", description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[-1]
    )
    p.add_argument("a", type=Path, help="the work tree of A (the baseline)")
    p.add_argument("b", type=Path, help="the work tree of B (may be A's, with --b-env)")
    p.add_argument("--turns", type=int, default=400, help="measured turns for each (default 400)")
    p.add_argument(
        "--b-env", type=_setting, action="append", default=[], metavar="NAME=VALUE",
        help="an environment setting for B's processes only (repeatable), e.g. TENDON_CONCURRENCY=8",
    )  # fmt: skip
    p.add_argument("--load", type=int, default=0, metavar="K", help="compare throughput at K calls in flight")
    p.add_argument("--windows", type=int, default=6, help="with --load: windows each (default 6)")
    p.add_argument(
        "--seconds", type=float, default=LOAD_SECONDS, help="with --load: how long a window lasts (default 6)"
    )
    args = p.parse_args()
    for tree in (args.a, args.b):
        if not (tree / "brain" / "__main__.py").is_file():
            print(f"bench.ab: {tree} is not a Tendon work tree (no brain/__main__.py)", file=sys.stderr)
            return 2
    for flag in ("turns", "windows", "seconds"):
        if getattr(args, flag) <= 0:
            print(f"bench.ab: --{flag} must be more than 0", file=sys.stderr)
            return 2
    if args.load < 0:
        print("bench.ab: --load must be more than 0 (or left out)", file=sys.stderr)
        return 2
    trees = (args.a.resolve(), args.b.resolve())
    windows = (args.windows, args.seconds)
    try:
        a, b = asyncio.run(compare(trees, dict(args.b_env), args.turns, args.load, windows))
    except NotStarted as exc:
        print(f"bench.ab: {exc}", file=sys.stderr)
        return 1
    width = max(map(len, a)) + 2
    print(f"{'p50':<{width}}{'A':>9}{'B':>9}{'B - A':>9}")
    for key in a:
        print(f"{key:<{width}}{a[key]:>9.3f}{b.get(key, 0.0):>9.3f}{b.get(key, 0.0) - a[key]:>+9.3f}")
    if args.load:
        print(f"{args.windows} windows of {args.load} calls in flight each, alternating; CPU: ms per call")
    else:
        print(f"{args.turns} lone 1-call turns each, alternating; ms; span: submit to result applied,")
        print("cut where the reply, the Hands' accept, their outcome and the apply start (each from")
        print("its transaction's now(); the medians of the stretches need not add up to the span's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
