"""docker-compose.yml run for real on a Docker engine with Compose v2: the image built, the stack up
with ``--wait`` on free host ports, turns submitted through the published API, and then the faults
a deployment meets: a Hands container's process SIGKILLed inside a tool, a Brain's SIGKILLed under
load, Hands scaled to three, PostgreSQL and RabbitMQ restarted under load, RabbitMQ re-created with
a command queued for a stopped pool, and ``down`` and ``up`` again. At the end every turn is there
and completed, no email was sent twice, and no request was answered with a 500; ``down -v`` then
removes everything the test made.

It takes minutes, so it runs only under TENDON_TEST_COMPOSE=1 (and then fails when no engine is
found); without, it is skipped saying so. Its figures (seconds to healthy, to recover from each
fault) are printed, and written as JSON to TENDON_COMPOSE_FIGURES when that names a file;
docs/chaos/README.md quotes a run's.

On a machine without an image registry, ``/work/shared/containers/setup.sh`` (a kit beside this
repository on the project's machines) starts an engine and builds stand-ins of the images::

    . /var/tmp/containers/env && TENDON_TEST_COMPOSE=1 python3 -m pytest -n 0 -s tests/test_compose_live.py
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from chaos.compose import ComposeProject
from protocol import TransientError
from tests.support import REPO

T = TypeVar("T")
pytestmark = [pytest.mark.timeout(2400)]

FILES = [REPO / "docker-compose.yml", REPO / "chaos" / "slow-mailbox.yml"]  # a send takes a second
TERMINAL = ("completed", "failed", "cancelled")


def why_no_engine() -> str | None:
    """Why no Docker engine with Compose v2 can be used from here (None: one can)."""
    if shutil.which("docker") is None:
        return "no `docker` command on the PATH"
    for args, what in ((["docker", "compose", "version"], "Compose v2"), (["docker", "info"], "the engine")):
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{what}: {exc}"
        if done.returncode != 0:
            said = " ".join(done.stderr.split())[-300:]
            return f"{what} does not answer (`{' '.join(args)}`): {said}"
    return None


def free_port() -> int:
    """A free host port below 32768 (the kernel picks client ports above), never 5432/5672/8080."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20000 and 32000")


class Live:
    """The project under test: its docker compose command and what the test measured."""

    def __init__(self, name: str, port: int, log_dir: Path) -> None:
        self.name = name
        self.env = {**os.environ, "TENDON_HTTP_PORT": str(port)}
        self.compose = ["docker", "compose", "-p", name, *(a for f in FILES for a in ("-f", str(f)))]
        self.log_dir = log_dir
        self.figures: dict[str, Any] = {}
        self.statuses: list[int] = []  # every status the API answered to the test's waits
        self.project: ComposeProject | None = None
        self.turns: list[str] = []

    def run(self, *args: str, timeout: float = 900.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*self.compose, *args], cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise AssertionError(f"docker compose {' '.join(args)}: {done.returncode}\n{done.stderr[-3000:]}")
        return done

    async def timed(self, what: str, *args: str) -> float:
        """Seconds ``docker compose ARGS`` took, noted under ``what``."""
        started = time.monotonic()
        await asyncio.to_thread(self.run, *args)
        self.figures[what] = round(time.monotonic() - started, 1)
        return float(self.figures[what])

    @property
    def target(self) -> ComposeProject:
        assert self.project is not None
        return self.project


async def patiently(work: Callable[[], Awaitable[T]], within: float = 180.0) -> T:
    """``work()``, tried again while the API cannot answer (a Brain restarting, a service away)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await work()
        except TransientError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[Live]:
    if os.environ.get("TENDON_TEST_COMPOSE") != "1":
        found = why_no_engine()
        pytest.skip(
            "runs docker-compose.yml on a Docker engine for minutes: TENDON_TEST_COMPOSE=1 runs it"
            + (f" (and here it would fail: {found})" if found else "")
        )
    if found := why_no_engine():
        pytest.fail(f"TENDON_TEST_COMPOSE=1 but no Docker engine with Compose v2 can be used: {found}")
    project = Live(f"tendon-live-{uuid.uuid4().hex[:6]}", free_port(), tmp_path)
    try:
        yield project
    finally:
        if project.project is not None:
            await project.project.close()  # its API client, its watch on the engine's events
            project.figures["container_starts"] = project.project.restarts
        # Beside the figures when they are kept (pytest keeps only its last few temporary folders).
        figures = os.environ.get("TENDON_COMPOSE_FIGURES")
        kept = Path(figures).with_suffix(".log") if figures else tmp_path / "compose.log"
        logs = project.run("logs", "--no-color", "--timestamps", check=False, timeout=120)
        await asyncio.to_thread(kept.write_text, logs.stdout + logs.stderr)
        project.run("down", "-v", "--remove-orphans", "--timeout", "30", check=False, timeout=300)
        print(f"\n[compose-live] figures: {json.dumps(project.figures)} (logs: {kept})")
        if figures:
            await asyncio.to_thread(Path(figures).write_text, json.dumps(project.figures, indent=2) + "\n")


async def submit(live: Live, tag: str, count: int) -> list[str]:
    """``count`` turns of one email each, through the published API."""
    target = live.target
    agent = target.agents["send_email"]

    async def one(n: int) -> str:
        key = f"{live.name}-{tag}-{n}"
        return await patiently(lambda: target.api.submit(key, key, "go", agent))

    turns = list(await asyncio.gather(*(one(n) for n in range(count))))
    live.turns += turns
    return turns


async def ended(live: Live, turns: list[str], within: float = 180.0) -> float:
    """Wait until every turn ended, as a client that waits on each does (``GET
    /v1/turns/{id}?wait=``, its status noted); return the monotonic time the last one ended."""
    deadline = time.monotonic() + within
    async with httpx.AsyncClient(base_url=str(live.target.url), timeout=30.0) as http:

        async def wait(turn: str) -> float:
            while time.monotonic() < deadline:
                try:
                    answer = await http.get(f"/v1/turns/{turn}", params={"wait": "5s"})
                except httpx.TransportError:  # the Brain restarting: nothing answers
                    await asyncio.sleep(0.5)
                    continue
                live.statuses.append(answer.status_code)
                if answer.status_code == 200 and answer.json()["status"] in TERMINAL:
                    return time.monotonic()
                if answer.status_code != 200:
                    await asyncio.sleep(0.2)
            raise AssertionError(f"turn {turn} did not end within {within:g} s")

        return max(await asyncio.gather(*(wait(t) for t in turns)))


async def ready_id(live: Live, container: str) -> str:
    """The worker id in a container's ready file ('' while there is none)."""
    args = ["docker", "exec", container, "cat", "/run/tendon/ready"]
    done = await asyncio.to_thread(subprocess.run, args, capture_output=True, text=True)
    return done.stdout.strip()


async def test_the_compose_stack_runs_keeps_its_data_and_rides_out_its_faults(live: Live) -> None:
    figures = live.figures
    # ---- build and start, healthy only once ready
    await live.timed("build_s", "build")
    await live.timed("startup_to_healthy_s", "up", "-d", "--wait")
    live.project = ComposeProject(live.compose, env=live.env)
    await live.target.start()
    assert live.target.url == f"http://127.0.0.1:{live.env['TENDON_HTTP_PORT']}"

    # ---- turns through the published API
    first = await submit(live, "first", 3)
    await ended(live, first)

    # ---- the CLI in the Brain's container (through its API) and the demo in the image
    cli = ["exec", "-T", "brain", "brain"]
    agent = ["--agent", "examples/notice_agent.json", "Send the notice"]
    turn = live.run(*cli, "submit", "--session", "cli", "--request-id", "one", *agent).stdout.strip()
    live.turns.append(turn)
    assert "completed" in live.run(*cli, "wait", turn).stdout
    assert live.run(*cli, "demo", "--fresh").returncode == 0
    brain = (await live.target.containers("brain"))[0]["Name"]
    assert await ready_id(live, brain), "brain demo in the container left the Brain without its ready file"

    # ---- a Hands container's process SIGKILLed inside a tool
    hands = (await live.target.containers("hands-email"))[0]["Name"]
    dead = await ready_id(live, hands)
    sent = len((await live.target.mailbox_stats())["posts_per_key"])
    turns = await submit(live, "hands-kill", 4)
    deadline = time.monotonic() + 60
    while len((await live.target.mailbox_stats())["posts_per_key"]) == sent:  # a send is in the mailbox,
        assert time.monotonic() < deadline, "no email was sent"  # which answers it a second later
        await asyncio.sleep(0.05)
    killed = time.monotonic()
    await live.target.kill(hands)
    recovered = await ended(live, turns)
    await live.target.healthy("hands-email")
    figures["hands_kill_recovery_s"] = round(recovered - killed, 1)
    figures["hands_kill_healthy_again_s"] = round(time.monotonic() - killed, 1)
    figures["hands_kill_executions"] = sorted(
        str(e["how"]) for t in await live.target._turns(turns) for e in t["executions"]
    )
    again = await ready_id(live, hands)
    assert again and again != dead, f"the restarted container says ready as {again!r} (the dead one: {dead})"

    # ---- a Brain SIGKILLed with turns in flight
    turns = await submit(live, "brain-kill", 6)
    killed = time.monotonic()
    await live.target.kill(brain)
    figures["brain_kill_recovery_s"] = round(await ended(live, turns) - killed, 1)

    # ---- Hands scaled to three
    await live.timed("scale_hands_to_3_s", "up", "-d", "--wait", "--scale", "hands-email=3")
    assert len(await live.target.containers("hands-email")) == 3
    await ended(live, await submit(live, "scaled", 9))

    # ---- PostgreSQL, then RabbitMQ, restarted under load
    for service in ("postgres", "rabbitmq"):
        turns = await submit(live, f"{service}-restart", 12)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(live.run, "restart", service)
        back = time.monotonic()
        await live.target.healthy(service)
        figures[f"{service}_restart_healthy_s"] = round(time.monotonic() - back, 1)
        figures[f"{service}_restart_recovery_s"] = round(await ended(live, turns) - back, 1)

    # ---- RabbitMQ re-created while it holds a command for a pool that is stopped
    await asyncio.to_thread(live.run, "stop", "hands-email")
    (queued,) = await submit(live, "queued", 1)
    depth = ["exec", "-T", "rabbitmq", "rabbitmqctl", "-q", "list_queues", "--no-table-headers"]

    def commands_waiting() -> int:
        rows = [line.split() for line in live.run(*depth, "name", "messages").stdout.splitlines()]
        return sum(int(n) for name, n in (r for r in rows if len(r) == 2) if name == "tendon.email.commands")

    deadline = time.monotonic() + 60
    while commands_waiting() == 0:  # the relay published it
        assert time.monotonic() < deadline, "the command never reached its queue"
        await asyncio.sleep(0.5)
    recreate = ["up", "-d", "--wait", "--force-recreate", "--no-deps", "rabbitmq"]
    await live.timed("rabbitmq_recreate_to_healthy_s", *recreate)
    # Healthy is not recovered: each quorum queue elects its leader after the node answers (the
    # more queues, the later; the MCP pool's four made this one come after the first look).
    deadline = time.monotonic() + 30
    while commands_waiting() < 1:
        assert time.monotonic() < deadline, "the re-created RabbitMQ lost the queued command"
        await asyncio.sleep(0.5)
    await live.timed(
        "hands_start_after_recreate_s", "up", "-d", "--wait", "--scale", "hands-email=3", "hands-email"
    )
    started = time.monotonic()  # the queued command is there for them: not a re-send 10 s or more on
    figures["queued_command_after_hands_healthy_s"] = round(await ended(live, [queued]) - started, 1)

    # ---- down and up again: everything kept
    await asyncio.to_thread(live.run, "down")
    await live.timed("up_after_down_to_healthy_s", "up", "-d", "--wait")
    statuses = await patiently(lambda: live.target.statuses(live.turns))
    left = {t: s for t, s in statuses.items() if s != "completed"}
    assert statuses.keys() == set(live.turns) and not left, left
    await ended(live, await submit(live, "after-down", 3))

    # ---- no turn lost, no email sent twice, no 500
    posts = (await live.target.mailbox_stats())["posts_per_key"]  # a new project: every one is ours
    figures["turns"] = len(live.turns)
    figures["emails"] = len(posts)
    assert posts and max(posts.values()) == 1, {k: n for k, n in posts.items() if n > 1}
    assert 500 not in live.statuses, f"answers: {sorted(set(live.statuses))}"
    assert "max-size" in await live.target.inspect(brain, "{{json .HostConfig.LogConfig}}")
