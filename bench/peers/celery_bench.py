"""Drive the Celery peer: a worker process (prefork, 2 processes) and a client in threads.

Completion is the task's result arriving over ``rpc://`` at the client: the same thing a
Tendon user waits for (the tool result applied), measured at the caller.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.harness import Processes


def available() -> bool:
    try:
        import celery  # noqa: F401
    except ImportError:
        return False
    return True


class CeleryPeer:
    """A Celery worker process on a unique queue, and a client app in this process."""

    def __init__(self, amqp_url: str, procs: Processes, concurrency: int = 2) -> None:
        self.broker = amqp_url.replace("amqp://", "pyamqp://")
        self.queue = f"bench-celery-{uuid.uuid4().hex[:8]}"
        self.procs = procs
        self.concurrency = concurrency
        self.pool = ThreadPoolExecutor(max_workers=64)

    @property
    def env(self) -> dict[str, str]:
        return {"BENCH_CELERY_BROKER": self.broker, "BENCH_CELERY_QUEUE": self.queue}

    def start_worker(self) -> Any:
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "bench.peers.celery_app",
            "worker",
            "-Q",
            self.queue,
            "-c",
            str(self.concurrency),
            "--pool",
            "prefork",
            "--loglevel",
            "WARNING",
            "-n",
            f"{self.queue}-{uuid.uuid4().hex[:4]}@localhost",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        return self.procs.start("celery-worker", args, self.env)

    async def __aenter__(self) -> CeleryPeer:
        os.environ.update(self.env)
        import importlib

        import bench.peers.celery_app as celery_app

        self.mod = importlib.reload(celery_app)
        self.worker = self.start_worker()
        # Ready when a task round-trips (bounded).
        await asyncio.get_running_loop().run_in_executor(
            self.pool, lambda: self.mod.noop.apply_async(args=(0,)).get(timeout=60)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.procs.stop(self.worker)
        with self.mod.app.connection_for_write() as conn:
            ch = conn.default_channel
            ch.queue_delete(self.queue)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _one(self) -> float:
        t0 = time.perf_counter()
        self.mod.noop.apply_async(args=(1,)).get(timeout=30)
        return time.perf_counter() - t0

    async def sequential(self, n: int) -> list[float]:
        loop = asyncio.get_running_loop()
        return [await loop.run_in_executor(self.pool, self._one) for _ in range(n)]

    async def closed_loop(self, in_flight: int, duration: float) -> float:
        """``in_flight`` client threads, each apply_async + get in a loop; tasks per second."""
        stop = time.perf_counter() + duration

        def worker() -> int:
            n = 0
            while time.perf_counter() < stop:
                self._one()
                n += 1
            return n

        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        counts = await asyncio.wait_for(
            asyncio.gather(*(loop.run_in_executor(self.pool, worker) for _ in range(in_flight))),
            duration + 60,
        )
        return sum(counts) / (time.perf_counter() - t0)
