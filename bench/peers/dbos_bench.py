"""The DBOS peer: durable workflows of one step and of three on the same PostgreSQL, in a child process.

DBOS (``pip install dbos``, the ``bench`` extra) is a library: workflows run inside the
application process and checkpoint to a PostgreSQL "system database". The peer here is

    @DBOS.step()      async def noop_step(n)    -> n
    @DBOS.workflow()  async def one_step(n)     -> await noop_step(n)

and, like for like with a Tendon 1-call turn (a model step, a tool call, a model step),

    @DBOS.step()      async def model_step(n)   -> n + 1
    @DBOS.step()      async def tool_step(n)    -> n + 1
    @DBOS.workflow()  async def three_steps(n)  -> model_step(tool_step(model_step(n)))

run on one asyncio loop with ``DBOS.start_workflow_async(workflow, n)`` and
``handle.get_result()``; a workflow's time is from the start call to its result at the caller.
Each workflow commits its status (PENDING), each step's output and its final status
(SUCCESS); there is no broker hop, the steps run in the same process as the workflow. The two
shapes take turns (call by call for latency, level by level for throughput), so both see the
same machine.

The child process (``python -m bench.peers.dbos_bench child ...``) keeps DBOS's threads
and global state out of the harness; :class:`DBOSPeer` creates the database it uses
(``bench_<suffix>_dbos``), runs the child with bounded waits, ends it by its PID and drops
the database again, also when something fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import asyncpg

from bench.harness import Processes, Services
from bench.scenarios.base import Context

THREE_NAME = "DBOS workflow of 3 steps"  # like a 1-call turn: model, tool, model
SHAPES = (1, 3)  # steps per workflow; a result's keys: "rates"/"latencies" for 1, "..._3" for 3
QUICK_NOTE = "quick mode: DBOS not run (needs the `bench` extra and a child process); run without --quick"


def available() -> bool:
    try:
        import dbos  # noqa: F401
    except ImportError:
        return False
    return True


def version() -> str:
    try:
        from importlib.metadata import version as v

        return v("dbos")
    except Exception:  # noqa: BLE001 - only for the note
        return "?"


class DBOSPeer:
    """Runs the DBOS child against a database of its own; ``run`` returns its JSON result."""

    def __init__(self, services: Services, procs: Processes) -> None:
        self.services = services
        self.procs = procs
        self.dbname = f"{services.dbname}_dbos_{uuid.uuid4().hex[:6]}"

    @property
    def url(self) -> str:
        base = self.services.admin_url.rsplit("/", 1)[0]
        return f"{base}/{self.dbname}"

    async def _admin(self, sql: str) -> None:
        conn = await asyncpg.connect(self.services.admin_url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    async def run(self, mode: str, timeout: float, **options: Any) -> dict[str, Any]:
        """Create the database, run the child in ``mode``, drop the database; bounded."""
        out = self.procs.log_dir / f"dbos-{mode}-{uuid.uuid4().hex[:6]}.json"
        args = [sys.executable, "-m", "bench.peers.dbos_bench", "child", "--db", self.url, "--mode", mode]
        args += ["--out", str(out)]
        for key, value in options.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        await self._admin(f'CREATE DATABASE "{self.dbname}"')
        proc = None
        try:
            proc = self.procs.start(f"dbos-{mode}", args, {})
            deadline = time.monotonic() + timeout
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    tail = Processes.tail(proc)
                    raise TimeoutError(f"DBOS {mode} did not finish in {timeout:.0f}s: {tail}")
                await asyncio.sleep(0.1)
            if proc.returncode != 0 or not out.exists():
                raise RuntimeError(f"DBOS {mode} exited with {proc.returncode}: {Processes.tail(proc)}")
            result: dict[str, Any] = json.loads(out.read_text())
            return result
        finally:
            if proc is not None:
                self.procs.stop(proc)
            await self._admin(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')


async def maybe_run(ctx: Context, mode: str, timeout: float, **options: Any) -> dict[str, Any] | None:
    """Run the DBOS child unless in quick mode or not installed; None (and a note) if not run.

    A DBOS failure does not fail the scenario: the reason goes into the report's notes.
    """
    if ctx.quick:
        if QUICK_NOTE not in ctx.notes:
            ctx.notes.append(QUICK_NOTE)
        return None
    if not available():
        ctx.notes.append(f"DBOS ({mode}) not run: `import dbos` failed (pip install -e '.[bench]')")
        return None
    try:
        return await DBOSPeer(ctx.services, ctx.procs).run(mode, timeout, **options)
    except Exception as exc:  # noqa: BLE001 - reported, the Tendon figures still stand
        why = f"{type(exc).__name__}: {str(exc)[-600:]}"
        ctx.notes.append(f"DBOS ({mode}) FAILED, its column is empty: {why}")
        return None


# --------------------------------------------------------------------------- the child


def _child(ns: argparse.Namespace) -> int:
    from dbos import DBOS, DBOSConfig

    @DBOS.step()
    async def noop_step(n: int) -> int:
        return n

    @DBOS.workflow()
    async def one_step(n: int) -> int:
        return await noop_step(n)

    @DBOS.step()
    async def model_step(n: int) -> int:
        return n + 1

    @DBOS.step()
    async def tool_step(n: int) -> int:
        return n + 1

    @DBOS.workflow()
    async def three_steps(n: int) -> int:
        return await model_step(await tool_step(await model_step(n)))

    # steps -> (workflow, argument, the result that shows every step ran)
    workflows: dict[int, tuple[Callable[[int], Coroutine[Any, Any, int]], int, int]] = {
        1: (one_step, 1, 1),
        3: (three_steps, 0, 3),
    }

    config: DBOSConfig = {
        "name": "tendon-bench",
        "system_database_url": ns.db,
        "log_level": "WARNING",
        "sys_db_pool_size": ns.pool_size,
    }
    DBOS(config=config)
    DBOS.launch()

    async def call(steps: int) -> float:
        workflow, arg, expected = workflows[steps]
        t0 = time.perf_counter()
        handle = await DBOS.start_workflow_async(workflow, arg)
        if await handle.get_result() != expected:
            raise RuntimeError("wrong workflow result")
        return time.perf_counter() - t0

    async def closed_loop(steps: int, in_flight: int, duration: float) -> float:
        done = 0
        stop = time.perf_counter() + duration

        async def client() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                await call(steps)
                done += 1

        t0 = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(client() for _ in range(in_flight))), duration + 60)
        return done / (time.perf_counter() - t0)

    def key(name: str, steps: int) -> str:
        return name if steps == 1 else f"{name}_{steps}"

    async def main() -> dict[str, Any]:
        for _ in range(ns.warmup):
            for steps in SHAPES:
                await call(steps)
        if ns.mode == "latency":
            latencies: dict[int, list[float]] = {steps: [] for steps in SHAPES}
            for _ in range(ns.n):
                for steps in SHAPES:
                    latencies[steps].append(await call(steps))
            return {key("latencies", steps): xs for steps, xs in latencies.items()}
        for steps in SHAPES:
            await closed_loop(steps, 4, 1.0)
        rates: dict[int, dict[str, list[float]]] = {steps: {} for steps in SHAPES}
        for _ in range(ns.repeats):
            for k in (int(x) for x in ns.levels.split(",")):
                for steps in SHAPES:
                    rates[steps].setdefault(str(k), []).append(await closed_loop(steps, k, ns.duration))
        return {key("rates", steps): per for steps, per in rates.items()}

    try:
        result = asyncio.run(main())
    finally:
        DBOS.destroy(workflow_completion_timeout_sec=5)
    result["version"] = version()
    Path(ns.out).write_text(json.dumps(result))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(prog="bench.peers.dbos_bench")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("child", help="run the DBOS workflows (1 and 3 steps) and write JSON results")
    c.add_argument("--db", required=True)
    c.add_argument("--mode", choices=["latency", "throughput"], required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--n", type=int, default=100)
    c.add_argument("--warmup", type=int, default=20)
    c.add_argument("--levels", default="1,10,50")
    c.add_argument("--duration", type=float, default=10.0)
    c.add_argument("--repeats", type=int, default=3)
    c.add_argument("--pool-size", type=int, default=20)
    return _child(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
