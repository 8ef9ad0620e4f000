"""``python -m bench.ab A B``: does change B make a lone turn faster than A? Two deployments
(a Brain and a Hands process each, from work trees A and B, or from one tree twice with other
settings for B) serve alternate lone 1-call turns, and the latency headline's span (submit to
result applied) is compared, with the whole turn and the client-observed time beside it.

Why turn by turn: this host's speed moves from second to second. One tree's median over 250 lone
turns moved from 6.1 to 7.3 ms between two runs of the same code, and from 5.8 to 7.8 ms between
the quarters of one run, so runs one after another (even alternating, as the latency scenario's
blocks do) resolve only large differences. Served turn by turn, A and B meet the host alike: a
tree against itself differed by 0.14 ms over 400 turns each. Not a test and not the benchmark:
a tool for deciding whether a change to the hot path is worth keeping.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import Processes, Services, TendonWorld, one_call_agent

WARM_UP = 30  # turns per deployment before the measured ones: bindings, caches, connections


async def _world(tree: Path, services: Services, extra: dict[str, str]) -> TendonWorld:
    world = TendonWorld(services, Processes(Path(tempfile.mkdtemp(prefix="tendon-ab-")), tree), extra)
    await world.start_brain()
    await world.start_hands()
    await world.open()
    return world


async def compare(trees: tuple[Path, Path], turns: int, extra_b: dict[str, str]) -> list[dict[str, float]]:
    """Medians in ms (span, turn, client) for A and B, over ``turns`` turns each."""
    services = Services()
    await services.create_database()
    worlds: list[TendonWorld] = []
    try:
        worlds = [await _world(trees[0], services, {}), await _world(trees[1], services, extra_b)]
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
            found.append(
                {
                    "span": 1000 * statistics.median(span),
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


def _setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, not {text!r}")
    return name, value


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path, help="the work tree of A (the baseline)")
    p.add_argument("b", type=Path, help="the work tree of B (may be A's, with --b-env)")
    p.add_argument("--turns", type=int, default=400, help="measured turns for each (default 400)")
    p.add_argument(
        "--b-env", type=_setting, action="append", default=[], metavar="NAME=VALUE",
        help="an environment setting for B's processes only (repeatable), e.g. TENDON_CONCURRENCY=8",
    )  # fmt: skip
    args = p.parse_args()
    for tree in (args.a, args.b):
        if not (tree / "brain" / "__main__.py").is_file():
            print(f"bench.ab: {tree} is not a Tendon work tree (no brain/__main__.py)", file=sys.stderr)
            return 2
    if args.turns < 1:
        print("bench.ab: --turns must be at least 1", file=sys.stderr)
        return 2
    a, b = asyncio.run(compare((args.a.resolve(), args.b.resolve()), args.turns, dict(args.b_env)))
    print(f"{'ms (p50)':<10}{'A':>9}{'B':>9}{'B - A':>9}")
    for key in ("span", "turn", "client"):
        print(f"{key:<10}{a[key]:>9.3f}{b[key]:>9.3f}{b[key] - a[key]:>+9.3f}")
    print(f"{args.turns} lone 1-call turns each, alternating; span: submit to result applied")
    return 0


if __name__ == "__main__":
    sys.exit(main())
