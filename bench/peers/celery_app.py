"""The Celery peer's app: trivial tasks on the shared RabbitMQ, with durability switched on.

``noop`` is one task per call; ``model_step`` and ``tool_step`` make the like-for-like call, a
chain of three (model -> tool -> model) the way a Tendon 1-call turn is three steps.

``acks_late`` + ``task_reject_on_worker_lost`` (a killed worker's task is redelivered) and
``broker_transport_options={"confirm_publish": True}`` (publisher confirms). Results come back
through ``rpc://`` (a reply queue per client; no database). Configured from environment:
BENCH_CELERY_BROKER and BENCH_CELERY_QUEUE; a worker started with BENCH_CELERY_READY writes
that file once it consumes (the ``worker_ready`` signal).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery import Celery, chain
from celery.canvas import Signature
from celery.signals import worker_ready

app = Celery(
    "bench_celery",
    broker=os.environ.get("BENCH_CELERY_BROKER", "amqp://guest:guest@127.0.0.1:5672//"),
    backend="rpc://",
)
QUEUE = os.environ.get("BENCH_CELERY_QUEUE", "bench-celery")
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    broker_transport_options={"confirm_publish": True},
    task_default_queue=QUEUE,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=1,
    result_persistent=False,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    # No remote control: it would declare the shared ``celery.pidbox`` exchange on the broker.
    worker_enable_remote_control=False,
)


@app.task(name="bench.noop")
def noop(n: int = 0) -> int:
    """Do nothing."""
    return n


@app.task(name="bench.model_step")
def model_step(n: int = 0) -> int:
    """A scripted model step: nothing to compute, like the Brain's scripted model. ``n + 1``,
    so the chain's result shows that every step ran, in order, on its predecessor's result."""
    return n + 1


@app.task(name="bench.tool_step")
def tool_step(n: int) -> int:
    """The tool call between the two model steps: ``n + 1`` too."""
    return n + 1


def one_call_turn() -> Signature:
    """model -> tool -> model as one ``celery.chain``: each task's result is the next one's argument.

    The first two steps send no result to the client (``ignore_result``): the worker hands a
    step's return value to the next task itself, and the client, like a Tendon user waiting
    for the turn, waits only for the last. Their results over ``rpc://`` would be replies
    nobody reads (Celery keeps them in a buffer at the client), not durability.
    """
    return chain(
        model_step.s(0).set(ignore_result=True),
        tool_step.s().set(ignore_result=True),
        model_step.s(),
    )


@app.task(name="bench.sleepy")
def sleepy(marker: str, seconds: float) -> str:
    """Touch ``marker`` then sleep: a task to kill its worker in."""
    with open(marker, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(seconds)
    return marker


@app.task(name="bench.gated")
def gated(marker: str, gate: str, limit: float = 300.0) -> str:
    """Append ``pid time`` to ``marker`` (one line per start), then wait for the ``gate`` file.

    The worker-kill trials SIGKILL the process running this; ``limit`` bounds the wait.
    """
    with open(marker, "a") as f:
        f.write(f"{os.getpid()} {time.time()}\n")
    deadline = time.monotonic() + limit
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    return marker


@worker_ready.connect
def _announce_ready(**_: Any) -> None:
    ready = os.environ.get("BENCH_CELERY_READY")
    if ready:
        Path(ready).write_text(f"{os.getpid()}\n")
