"""Drive the Celery peer: a worker process (prefork, 2 processes) and a client in threads.

Completion is the task's result arriving over ``rpc://`` at the client: the same thing a
Tendon user waits for (the tool result applied), measured at the caller. A call is one
``noop`` task, or (``chain=True``) the like-for-like shape of a Tendon 1-call turn: a chain of
three tasks, model -> tool -> model (``celery_app.one_call_turn``), each handed from the
worker to the next task through the broker with a confirmed publish before its ack, and the
last one's result at the client.

Worker-kill redelivery (:meth:`CeleryPeer.kill_trial`): a ``gated`` task blocks on a gate
file; the harness SIGKILLs either the prefork *child* running it or the *whole worker* (its
main process; Celery's children die with it by ``PR_SET_PDEATHSIG``), and measures from the
signal to the moment the task body starts again. What Celery does in each case:

* child killed: the worker's main process notices the pool process is gone (at once through
  the child's sentinel, or at its periodic ``maintain_pool``, every 5 s, when the child was not
  tracked: both happen here, so the figures are bimodal), raises ``WorkerLostError`` for the
  job and, because of ``acks_late`` + ``task_reject_on_worker_lost``, rejects the message with
  ``requeue=True``; RabbitMQ delivers it again to a consumer with a free prefetch slot (with
  two workers running that was the other worker) and the body runs again;
* whole worker killed: nothing in the worker acts; the kernel closes its AMQP socket,
  RabbitMQ requeues the unacked message when it sees the connection close, and delivers it
  to another worker consuming the queue (one is kept running, like Tendon's surviving Hands).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.harness import Processes, gate_starts, wait_for
from bench.scenarios.base import Context

CHAIN_NAME = "Celery chain of 3 tasks"  # like a 1-call turn: model -> tool -> model
CHAIN_RESULT = 3  # model_step(0) -> tool_step -> model_step, each adds one
QUICK_NOTE = (
    "quick mode: Celery throughput and latency not run (needs the `bench` extra); run without"
    " --quick (its worker-kill recovery trials do run in quick mode when Celery is installed)"
)
MISSING_NOTE = "Celery is not installed (pip install -e '.[bench]'): its columns are empty"


def available() -> bool:
    try:
        import celery  # noqa: F401
    except ImportError:
        return False
    return True


def skipped(ctx: Context) -> bool:
    """True when Celery's throughput and latency are not run here (quick mode, or no Celery);
    the reason goes into the notes once, however many scenarios ask."""
    why = QUICK_NOTE if ctx.quick else None if available() else MISSING_NOTE
    if why is not None and why not in ctx.notes:
        ctx.notes.append(why)
    return why is not None


class CeleryPeer:
    """A Celery worker process on a unique queue, and a client app in this process."""

    def __init__(self, amqp_url: str, procs: Processes, concurrency: int = 2) -> None:
        self.broker = amqp_url.replace("amqp://", "pyamqp://")
        self.queue = f"bench-celery-{uuid.uuid4().hex[:8]}"
        self.procs = procs
        self.concurrency = concurrency
        self.pool = ThreadPoolExecutor(max_workers=64)
        self.workers: list[subprocess.Popen[bytes]] = []  # every worker process started here

    @property
    def env(self) -> dict[str, str]:
        return {"BENCH_CELERY_BROKER": self.broker, "BENCH_CELERY_QUEUE": self.queue}

    def start_worker(self, ready: Path | None = None) -> Any:
        env = {**self.env, "BENCH_CELERY_READY": str(ready) if ready else ""}
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
        return self.procs.start("celery-worker", args, env)

    async def start_worker_ready(self, timeout: float = 60.0) -> subprocess.Popen[bytes]:
        """Start one more worker on the queue and wait until it consumes (``worker_ready``)."""
        ready = self.procs.log_dir / f"celery-ready-{uuid.uuid4().hex[:8]}"
        proc = self.start_worker(ready)
        self.workers.append(proc)

        async def is_ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"celery worker exited with {proc.returncode}: {Processes.tail(proc)}")
            return ready.exists()

        await wait_for(is_ready, timeout=timeout, what="celery worker ready")
        return proc

    async def __aenter__(self) -> CeleryPeer:
        os.environ.update(self.env)
        import importlib

        import bench.peers.celery_app as celery_app

        self.mod = importlib.reload(celery_app)
        try:
            self.worker = await self.start_worker_ready()
            # Ready when a task round-trips (bounded).
            await asyncio.get_running_loop().run_in_executor(
                self.pool, lambda: self.mod.noop.apply_async(args=(0,)).get(timeout=60)
            )
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Stop every worker by its PID, then delete the queue and the exchange of its name."""
        try:
            for proc in reversed(self.workers):
                self.procs.stop(proc)
        finally:
            try:
                await asyncio.wait_for(asyncio.to_thread(self._delete_queue), 60)
            finally:
                self.pool.shutdown(wait=False, cancel_futures=True)

    def _delete_queue(self) -> None:
        with self.mod.app.connection_for_write() as conn:
            ch = conn.default_channel
            ch.queue_delete(self.queue, if_unused=False, if_empty=False)
            # Celery declares a direct exchange named after the default queue.
            ch.exchange_delete(self.queue)

    def _one(self, chain: bool = False) -> float:
        """One call, from apply_async to its result at this client; seconds."""
        t0 = time.perf_counter()
        if chain:
            if self.mod.one_call_turn().apply_async().get(timeout=30) != CHAIN_RESULT:
                raise RuntimeError("the chain's result says a step did not run")
        else:
            self.mod.noop.apply_async(args=(1,)).get(timeout=30)
        return time.perf_counter() - t0

    async def sequential(self, n: int, chain: bool = False) -> list[float]:
        loop = asyncio.get_running_loop()
        return [await loop.run_in_executor(self.pool, self._one, chain) for _ in range(n)]

    async def closed_loop(self, in_flight: int, duration: float, chain: bool = False) -> float:
        """``in_flight`` client threads, each apply_async + get in a loop; calls (tasks, or
        chains of three with ``chain``) per second."""
        stop = time.perf_counter() + duration

        def worker() -> int:
            n = 0
            while time.perf_counter() < stop:
                self._one(chain)
                n += 1
            return n

        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        counts = await asyncio.wait_for(
            asyncio.gather(*(loop.run_in_executor(self.pool, worker) for _ in range(in_flight))),
            duration + 60,
        )
        return sum(counts) / (time.perf_counter() - t0)

    # ------------------------------------------------------------------ worker-kill trials

    async def kill_trial(
        self, whole_worker: bool, timeout: float = 60.0, replace: bool = True
    ) -> dict[str, Any]:
        """SIGKILL the process running a ``gated`` task; seconds until its body starts again.

        ``whole_worker``: kill the worker's main process (its pool children die with it) and
        let another running worker take the requeued message; a replacement worker is then
        started (not timed; unless ``replace`` is false) so the next trial has a survivor too.
        Otherwise kill only the prefork child running the task. Returns ``seconds`` and where
        the body ran again.
        """
        if whole_worker and len([w for w in self.workers if w.poll() is None]) < 2:
            raise RuntimeError("a whole-worker kill needs a second worker running")
        tag = uuid.uuid4().hex[:8]
        marker = self.procs.log_dir / f"celery-{tag}.started"
        gate = self.procs.log_dir / f"celery-{tag}.gate"
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(
            self.pool, lambda: self.mod.gated.apply_async(args=(str(marker), str(gate)))
        )
        try:

            async def started_once() -> list[tuple[int, float]]:
                return gate_starts(marker)

            child, _ = (await wait_for(started_once, timeout=timeout, what="gated task start"))[0]
            worker = next((w for w in self.workers if w.poll() is None and _ppid(child) == w.pid), None)
            if worker is None:  # only ever signal a process this harness started
                raise RuntimeError(f"process {child} running the task is not a child of our workers")
            victim = worker.pid if whole_worker else child
            killed_at = time.time()
            os.kill(victim, signal.SIGKILL)

            async def started_again() -> list[tuple[int, float]]:
                starts = gate_starts(marker)
                return starts if len(starts) >= 2 else []

            again_pid, again_at = (
                await wait_for(started_again, timeout=timeout, interval=0.01, what="task body again")
            )[1]
            took = again_at - killed_at
            where = "another worker" if _ppid(again_pid) != worker.pid else "the same worker"
            if whole_worker:
                await loop.run_in_executor(self.pool, lambda: worker.wait(timeout=10))
                self.workers.remove(worker)
                await _gone(child)
        finally:
            gate.touch()
        await loop.run_in_executor(self.pool, lambda: result.get(timeout=timeout))
        if whole_worker and replace:
            await self.start_worker_ready()
        return {"seconds": took, "ran_again_in": where}


def _ppid(pid: int) -> int | None:
    """The parent PID of ``pid`` from /proc (None when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


async def _gone(pid: int, timeout: float = 5.0) -> None:
    """Wait for the orphaned pool child of a killed worker to be gone (PDEATHSIG kills it).

    If it is still there after ``timeout`` it is SIGKILLed by its PID: it was a child of a
    worker this harness started (checked before the kill).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state == "Z":
            return
        await asyncio.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
