"""A compose project that runs already, as the chaos run's target (``python -m chaos run
--compose``): its containers are the processes the faults kill, freeze and restart, its services
the ones they cut, stall and restart, and the turns go through its published HTTP API, as a
client's do. Nothing is started or removed: the turns stay in the project's database.

The project must run what docker-compose.yml runs: a Brain service (``brain serve``) with its API
published on the host, a Hands service of route ``email`` serving ``examples.email_tools``, the
example mailbox (the counting service: it counts every POST by idempotency key, the execution
id), and services of the ``postgres`` and ``rabbitmq`` images.

=======================================  ==========================================================
fault                                    in a compose project
=======================================  ==========================================================
Brain or Hands SIGKILL                   the process in a container: from inside it with ``init:
                                         true`` (its container exits and the restart policy starts
                                         it again), else its PID 1 from the host (a local engine)
Brain or Hands SIGSTOP past its lease    ``docker pause`` for its ``TENDON_LEASE_SECONDS`` and 3 s
SIGTERM                                  ``docker restart``: a drain, then a start
PostgreSQL connections cut               every client session ended (``pg_terminate_backend``)
RabbitMQ connections cut                 ``rabbitmqctl close_all_connections``
PostgreSQL or RabbitMQ stalled           ``docker compose pause`` of the service for 3 s
PostgreSQL or RabbitMQ restarted         ``docker compose restart``, lifted once it is healthy
=======================================  ==========================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shlex
import signal
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bench.harness import agent
from brain.face.client import AsyncClient
from chaos.faults import Fault, Injected
from protocol import TendonError

if TYPE_CHECKING:
    from chaos.run import Shape

STALL = 3.0
ROUTE = "email"
HEALTHY_WITHIN = 180.0  # seconds a restarted service may take to be healthy again
# Run in a container started with ``init: true``: SIGKILL the processes whose parent is its init
# (what the container runs), as the kernel's out-of-memory killer would. A process started by
# ``docker exec`` has no parent in the container, so this one is spared.
KILL_INIT_CHILDREN = """
import os, signal
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        continue
    if fields[1] == "1":
        os.kill(int(pid), signal.SIGKILL)
"""
# Every client session but this one ends, as a PostgreSQL restart would end them.
CUT_SESSIONS = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
    " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
)
# psql as the image's own user, with the statement as the shell's $0 (no quoting to get wrong).
PSQL = 'exec psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d "${POSTGRES_DB:-$POSTGRES_USER}" -Atc "$0"'


class ComposeError(RuntimeError):
    """A docker command failed, or the project lacks what the run needs."""


@dataclass
class Service:
    name: str
    image: str
    command: list[str]
    environment: dict[str, str] = field(default_factory=dict)


def services_of(config: dict[str, Any]) -> dict[str, Service]:
    """The services of ``docker compose config --format json``."""
    found = {}
    for name, spec in (config.get("services") or {}).items():
        command = spec.get("command") or []
        environment = spec.get("environment") or {}
        found[name] = Service(
            name,
            str(spec.get("image") or ""),
            shlex.split(command) if isinstance(command, str) else [str(a) for a in command],
            {k: "" if v is None else str(v) for k, v in environment.items()},
        )
    return found


def option(command: list[str], name: str) -> str | None:
    """The value of ``--name VALUE`` in a command line."""
    return command[command.index(name) + 1] if name in command[:-1] else None


class ComposeProject:
    """The chaos run's target in a running compose project (``docker compose`` + ``compose``)."""

    tools: tuple[str, ...] = ("send_email", "list_customers")  # examples/email_tools.py: asked, safe
    blind: frozenset[str] = frozenset()  # every tool of the route can be asked or re-run
    safe = frozenset({"list_customers"})
    look_every = 0.25  # through the API: a request per turn in flight at each look

    def __init__(
        self,
        compose: list[str],
        *,
        url: str | None = None,
        token: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.compose = compose  # the command that reaches the project: docker compose [-p P] [-f F]
        self.env = env  # the environment of the docker commands (the file's ${...}), else this one's
        self.url = url
        self.token = token
        self.run_id = uuid.uuid4().hex[:6]  # the run's sessions and request ids are its own
        self.services: dict[str, Service] = {}
        self.client: AsyncClient | None = None
        self.project = ""
        self._starts: asyncio.Task[None] | None = None  # counts container starts into _restarts
        self._ours: set[str] = set()  # the executions of this run's turns (the mailbox keeps others')
        self._restarts = 0
        message = {"to": "chaos@example.com", "subject": "chaos", "body": "an email of a chaos run"}
        args = {"send_email": message, "list_customers": {}}
        self.agents = {t: agent(f"chaos-{t}", [[{"tool": t, "args": args[t]}]], [t]) for t in self.tools}

    # ---- docker ---------------------------------------------------------------------------

    async def _run(self, *args: str, within: float = 300.0) -> str:
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=self.env
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), within)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise ComposeError(f"`{shlex.join(args)}` did not end within {within:g} s") from None
        if proc.returncode != 0:
            why = err.decode(errors="replace").strip() or out.decode(errors="replace").strip()
            raise ComposeError(f"`{shlex.join(args)}` failed ({proc.returncode}): {why[-500:]}")
        return out.decode()

    async def docker(self, *args: str, within: float = 300.0) -> str:
        return await self._run("docker", *args, within=within)

    async def project_cmd(self, *args: str, within: float = 300.0) -> str:
        return await self._run(*self.compose, *args, within=within)

    async def containers(self, service: str | None = None) -> list[dict[str, Any]]:
        """The project's running containers (of ``service``): docker compose ps, one JSON each."""
        text = await self.project_cmd("ps", "--format", "json", *([service] if service else []))
        text = text.strip()
        rows = json.loads(text) if text.startswith("[") else [json.loads(line) for line in text.splitlines()]
        return [r for r in rows if r.get("State") == "running"]

    async def inspect(self, container: str, template: str) -> str:
        return (await self.docker("inspect", "-f", template, container)).strip()

    # ---- what the project runs ------------------------------------------------------------

    def _one(self, what: str, match: Callable[[Service], bool]) -> str:
        found = [s.name for s in self.services.values() if match(s)]
        if not found:
            raise ComposeError(f"the compose project runs no {what}")
        return found[0]

    @property
    def tendon(self) -> list[str]:
        serving = (["brain", "serve"], ["hands", "serve"])
        return [s.name for s in self.services.values() if s.command[:2] in serving]

    async def start(self) -> None:
        config = json.loads(await self.project_cmd("config", "--format", "json"))
        self.project = str(config.get("name") or "")
        self.services = services_of(config)
        self.brain = self._one("Brain (brain serve)", lambda s: s.command[:2] == ["brain", "serve"])
        self.hands = self._one(
            f"Hands service of route {ROUTE}",
            lambda s: s.command[:2] == ["hands", "serve"] and option(s.command, "--route") == ROUTE,
        )
        self.mailbox = self._one("example mailbox", lambda s: "examples.mailbox" in s.command)
        self.postgres = self._one("PostgreSQL (a postgres image)", lambda s: "postgres" in s.image)
        self.rabbitmq = self._one("RabbitMQ (a rabbitmq image)", lambda s: "rabbitmq" in s.image)
        if not self.url:
            inside = self.services[self.brain].environment.get("TENDON_HTTP", "127.0.0.1:8080")
            published = (await self.project_cmd("port", self.brain, inside.rpartition(":")[2])).strip()
            if not published:
                raise ComposeError(f"the Brain service {self.brain} publishes no port: give --url")
            host, _, port = published.rpartition(":")
            self.url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '[::]') else host}:{port}"
        self.client = AsyncClient(self.url, self.token, timeout=30.0)
        self._starts = asyncio.create_task(self._count_starts(), name="container-starts")

    def describe(self, shape: Shape) -> str:
        return (
            f"the compose project `{self.project}` ({len(self.tendon)} Brain and Hands services:"
            f" {', '.join(self.tendon)}, route `{ROUTE}`), {shape.in_flight} turns in flight through its"
            f" API at {self.url}, each one call of `send_email` or `list_customers`; containers that"
            " exit are restarted by their restart policy"
        )

    async def _count_starts(self) -> None:
        """Count the starts of Brain and Hands containers as they come (the engine's events): by
        their restart policy after their process exited, or by ``docker restart``. A container's
        RestartCount counts only the first kind (and ``docker restart`` sets it back to 0), and
        the engine keeps its last 256 events only, which health checks fill within minutes."""
        proc = await asyncio.create_subprocess_exec(
            "docker", "events", "--filter", f"label=com.docker.compose.project={self.project}",
            "--filter", "event=start", "--format", '{{index .Actor.Attributes "com.docker.compose.service"}}',
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=self.env,
        )  # fmt: skip
        assert proc.stdout is not None
        try:
            while line := await proc.stdout.readline():
                self._restarts += line.decode().strip() in self.tendon
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()

    @property
    def restarts(self) -> int:
        return self._restarts

    async def close(self) -> None:
        if self._starts is not None:
            self._starts.cancel()
            await asyncio.gather(self._starts, return_exceptions=True)
        if self.client is not None:
            await self.client.close()

    # ---- the turns, through the API -------------------------------------------------------

    @property
    def api(self) -> AsyncClient:
        assert self.client is not None, "start() first"
        return self.client

    async def submit(self, n: int, tool: str) -> str:
        key = f"chaos-{self.run_id}-{n}"
        return await self.api.submit(key, key, "go", self.agents[tool])

    async def _turns(self, turns: list[str]) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for start in range(0, len(turns), 16):  # a few requests at a time
            found += await asyncio.gather(*(self.api.turn(t) for t in turns[start : start + 16]))
        self._ours.update(e["id"] for t in found for e in t["executions"])
        return found

    async def statuses(self, turns: list[str]) -> dict[str, str]:
        return {t["turn_id"]: t["status"] for t in await self._turns(turns)}

    async def unknown(self, turns: list[str]) -> list[tuple[str, str, str]]:
        return [
            (e["id"], e["tool"], t["turn_id"])
            for t in await self._turns(turns)
            for e in t["executions"]
            if e["status"] == "unknown"
        ]

    async def executions(self, turns: list[str]) -> dict[str, str]:
        return {e["id"]: e["tool"] for t in await self._turns(turns) for e in t["executions"]}

    async def errors(self, turns: list[str]) -> dict[str, str]:
        return {t["turn_id"]: str(t["error"]) for t in await self._turns(turns)}

    async def reconcile(self, execution_id: str, happened: bool) -> str | None:
        outcome: dict[str, Any] = (
            {"result": {"receipt": "seen by the mailbox"}} if happened else {"failure": "not sent"}
        )
        try:
            await self.api.reconcile(
                execution_id, evidence="the mailbox's own count of posts", actor="chaos", **outcome
            )
        except TendonError as exc:  # refused: not UNKNOWN (any more), or not an operator's token
            return exc.message
        return None

    async def mailbox_stats(self) -> dict[str, Any]:
        """The mailbox's ``GET /stats``, from inside its container (it publishes no port)."""
        port = option(self.services[self.mailbox].command, "--port") or "8025"
        url = f"http://127.0.0.1:{port}/stats"
        read = f"import urllib.request; print(urllib.request.urlopen({url!r}).read().decode())"
        text = await self.project_cmd("exec", "-T", self.mailbox, "python", "-c", read, within=60)
        stats: dict[str, Any] = json.loads(text)
        return stats

    async def posts(self) -> dict[str, int]:
        """POSTs per operation id. The mailbox keeps what other runs posted: only this run's
        executions count."""
        stats = await self.mailbox_stats()
        return {str(k): int(n) for k, n in stats["posts_per_key"].items() if k in self._ours}

    # ---- faults ---------------------------------------------------------------------------

    async def inject(self, fault: Fault, rng: random.Random, clock: Callable[[], float]) -> Injected:
        """Inject ``fault``; return when it was injected and when it was lifted."""
        if fault in (Fault.PG_CUT, Fault.AMQP_CUT):
            service = self.postgres if fault is Fault.PG_CUT else self.rabbitmq
            at = clock()
            if fault is Fault.PG_CUT:
                await self.project_cmd("exec", "-T", service, "sh", "-c", PSQL, CUT_SESSIONS)
            else:
                why = "chaos: connections cut"
                await self.project_cmd("exec", "-T", service, "rabbitmqctl", "close_all_connections", why)
            return Injected(fault, at, clock(), target=service)
        if fault in (Fault.PG_STALL, Fault.AMQP_STALL, Fault.PG_RESTART, Fault.AMQP_RESTART):
            service = self.postgres if fault in (Fault.PG_STALL, Fault.PG_RESTART) else self.rabbitmq
            at = clock()
            if fault in (Fault.PG_STALL, Fault.AMQP_STALL):
                await self.project_cmd("pause", service)
                try:
                    await asyncio.sleep(STALL)
                finally:
                    await self.project_cmd("unpause", service)
            else:
                await self.project_cmd("restart", service)
                await self.healthy(service)
            return Injected(fault, at, clock(), target=service)
        service = self.brain if fault.name.startswith("BRAIN") else self.hands
        container = rng.choice(await self.running(service))
        at = clock()
        if fault.name.endswith("KILL"):
            await self.kill(container)
        elif fault.name.endswith("TERM"):
            await self.docker("restart", "--time", "30", container)
        else:
            lease = float(self.services[service].environment.get("TENDON_LEASE_SECONDS") or 30.0)
            await self.docker("pause", container)
            try:
                await asyncio.sleep(lease + 3.0)
            finally:
                await self.docker("unpause", container)
        return Injected(fault, at, clock(), target=container)

    async def running(self, service: str) -> list[str]:
        """The running containers of ``service``, once there is one (an earlier fault may have
        left its only container restarting)."""
        deadline = asyncio.get_running_loop().time() + HEALTHY_WITHIN
        while not (names := sorted(c["Name"] for c in await self.containers(service))):
            if asyncio.get_running_loop().time() > deadline:
                raise ComposeError(f"no container of {service} runs {HEALTHY_WITHIN:g} s on")
            await asyncio.sleep(0.5)
        return names

    async def kill(self, container: str) -> None:
        """SIGKILL what ``container`` runs, so that its restart policy starts it again (a ``docker
        kill`` counts as a stop asked for: the container would stay down)."""
        init, pid = (await self.inspect(container, "{{.HostConfig.Init}} {{.State.Pid}}")).split()
        if init == "true":
            # It ends with its container (exit code 137): the container's first PID is its sign.
            with contextlib.suppress(ComposeError):
                await self.docker("exec", container, "python", "-c", KILL_INIT_CHILDREN)
        else:
            os.kill(int(pid), signal.SIGKILL)  # PID 1 seen from the host: the engine runs here
        deadline = asyncio.get_running_loop().time() + 30.0
        while await self.inspect(container, "{{.State.Pid}}") == pid:
            if asyncio.get_running_loop().time() > deadline:
                raise ComposeError(f"{container} still runs its process 30 s after it was killed")
            await asyncio.sleep(0.1)

    async def healthy(self, service: str) -> None:
        """Return once every container of ``service`` is healthy (or running, without a check)."""
        deadline = asyncio.get_running_loop().time() + HEALTHY_WITHIN
        while True:
            rows = await self.project_cmd("ps", "-a", "--format", "{{.Name}} {{.State}} {{.Health}}", service)
            states = [line.split() for line in rows.splitlines() if line.strip()]
            if states and all(s[1] == "running" and (len(s) < 3 or s[2] == "healthy") for s in states):
                return
            if asyncio.get_running_loop().time() > deadline:
                raise ComposeError(f"{service} is not healthy {HEALTHY_WITHIN:g} s after a restart: {states}")
            await asyncio.sleep(0.5)
