"""The deployment the chaos run starts itself, and injects faults into (a ``chaos.run.Target``).

Several Brains and Hands processes (route ``chaos``) of one isolated world (``bench.harness``),
each reaching PostgreSQL and RabbitMQ through a loopback proxy that can cut or stall every
connection; two counting mailboxes (one that can be asked, one that cannot). A supervisor
restarts whatever exits, as a container's restart policy would. Turns are submitted and looked
at in the world's database, as `brain submit` without a URL does.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from bench.harness import TendonWorld, agent, free_port, wait_for
from brain import verbs
from brain.rules.agents import AgentDefinition
from brain.store import wake_channel
from chaos.faults import Fault, Injected
from chaos.proxy import TcpCutter
from examples.email_tools import http_json

if TYPE_CHECKING:
    from chaos.run import Shape

BRAIN = ["-m", "brain", "serve"]
HANDS = ["-m", "hands", "serve", "--route", "chaos", "--tools", "chaos.tools"]
LEASE = 4.0  # seconds: a frozen process is presumed dead this soon, so SIGSTOP tests take-over
GRACE = 8.0  # a connection lost with PostgreSQL itself (a restart) is taken again within this
FREEZE = LEASE + 3.0
STALL = 3.0


@dataclass
class Slot:
    kind: str  # "brain" or "hands"
    proc: subprocess.Popen[bytes]
    restarts: int = 0


class Deployment:
    tools: tuple[str, ...] = ("touch", "send", "send_blind")  # chaos/tools.py: safe, asked, blind
    blind = frozenset({"send_blind"})
    safe = frozenset({"touch"})
    look_every = 0.05

    def __init__(self, world: TendonWorld, shape: Shape) -> None:
        self.world = world
        self.counts = {"brain": shape.brains, "hands": shape.hands}
        self.slots: list[Slot] = []
        self.mailboxes: dict[str, str] = {}
        self.pg: TcpCutter | None = None
        self.amqp: TcpCutter | None = None
        self._supervisor: asyncio.Task[None] | None = None
        calls = {t: [[{"tool": t, "args": {"hold": shape.hold}}]] for t in self.tools}
        self.agents = {
            t: AgentDefinition.model_validate(agent(f"chaos-{t}", calls[t], [t])) for t in self.tools
        }
        self.known = verbs.KnownTools()  # the tools' announcements, read once: submits under faults read less

    def describe(self, shape: Shape) -> str:
        return (
            f"{shape.brains} Brains and {shape.hands} Hands workers (route `chaos`) started by the run on"
            f" the local services, {shape.in_flight} turns in flight, each tool holding {shape.hold} s"
            " before and after its call; processes that exit are restarted, as a restart policy would"
        )

    @property
    def restarts(self) -> int:
        return sum(s.restarts for s in self.slots)

    def env(self) -> dict[str, str]:
        assert self.pg is not None and self.amqp is not None
        return {
            "TENDON_DATABASE_URL": self.pg.url,
            "TENDON_AMQP_URL": self.amqp.url,
            "TENDON_LEASE_SECONDS": str(LEASE),
            "TENDON_RECONNECT_GRACE": str(GRACE),
            "TENDON_DRAIN_SECONDS": "5",
            "TENDON_LOG_LEVEL": "INFO",
            "CHAOS_MAILBOX_URL": self.mailboxes["asked"],
            "CHAOS_BLIND_MAILBOX_URL": self.mailboxes["blind"],
        }

    async def start(self) -> None:
        for name, extra in (("asked", []), ("blind", ["--no-lookup"])):
            port = free_port()
            args = [sys.executable, "-m", "examples.mailbox", "--port", str(port), *extra]
            self.world.procs.start(f"mailbox-{name}", args, {})
            url = self.mailboxes[name] = f"http://127.0.0.1:{port}"
            await wait_for(partial(_up, url), timeout=20, what=f"the {name} mailbox")
        self.pg = await TcpCutter(self.world.services.database_url).__aenter__()
        self.amqp = await TcpCutter(self.world.services.amqp_url).__aenter__()
        for kind, n in self.counts.items():
            for _ in range(n):
                self.slots.append(Slot(kind, await self._spawn(kind)))
        self._supervisor = asyncio.create_task(self._supervise())

    async def _spawn(self, kind: str) -> subprocess.Popen[bytes]:
        args = BRAIN if kind == "brain" else HANDS
        return await self.world.start_process(kind, args, self.env() | {"TENDON_SERVICE_WAIT_SECONDS": "inf"})

    async def _supervise(self) -> None:
        while True:
            for slot in self.slots:
                if slot.proc.poll() is not None:
                    slot.restarts += 1
                    try:
                        slot.proc = await self._spawn(slot.kind)
                    except Exception:  # noqa: BLE001 - tried again on the next look
                        await asyncio.sleep(1.0)
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
            await asyncio.gather(self._supervisor, return_exceptions=True)
        for slot in self.slots:
            if slot.proc.poll() is None:
                slot.proc.send_signal(signal.SIGCONT)
        for proxy in (self.pg, self.amqp):
            if proxy is not None:
                await proxy.__aexit__(None, None, None)

    # ---- the turns ------------------------------------------------------------------------

    async def submit(self, n: int, tool: str) -> str:
        s = self.world.settings
        turn_id, _ = await verbs.submit(
            self.world.store,
            namespace=s.namespace,
            session_id=f"chaos-{n}",
            request_id=f"chaos-{n}",
            user_input="go",
            agent=self.agents[tool],
            wake_channel=wake_channel(s),
            tools=self.known,
        )
        return str(turn_id)

    async def statuses(self, turns: list[str]) -> dict[str, str]:
        return await self.world.statuses(turns)

    async def unknown(self, turns: list[str]) -> list[tuple[str, str, str]]:
        rows = await self.world.fetch(
            "SELECT id, tool, turn_id FROM executions WHERE status = 'unknown' AND turn_id = ANY($1::text[])",
            turns,
        )
        return [(r["id"], r["tool"], r["turn_id"]) for r in rows]

    async def executions(self, turns: list[str]) -> dict[str, str]:
        sql = "SELECT id, tool FROM executions WHERE turn_id = ANY($1::text[])"
        rows = await self.world.fetch(sql, turns)
        return {r["id"]: r["tool"] for r in rows}

    async def errors(self, turns: list[str]) -> dict[str, str]:
        rows = await self.world.fetch("SELECT id, error FROM turns WHERE id = ANY($1::text[])", turns)
        return {r["id"]: str(r["error"]) for r in rows}

    async def reconcile(self, execution_id: str, happened: bool) -> str | None:
        """`hands reconcile`, as an operator runs it, from the blind mailbox's own count."""
        seen = json.dumps({"receipt": "seen by the provider"})
        outcome = ["--result", seen] if happened else ["--failed", "not sent"]
        args = [sys.executable, "-m", "hands", "reconcile", execution_id, *outcome,
                "--evidence", "the blind mailbox's own count of posts", "--actor", "chaos"]  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            *args, env={**self.world.env}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        text, _ = await proc.communicate()
        return None if proc.returncode == 0 else text.decode(errors="replace").strip()

    async def posts(self) -> dict[str, int]:
        """POSTs per operation id, both mailboxes together."""
        out: dict[str, int] = {}
        for url in self.mailboxes.values():
            _, stats = await asyncio.to_thread(http_json, "GET", f"{url}/stats")
            for key, n in stats["posts_per_key"].items():
                out[key] = out.get(key, 0) + int(n)
        return out

    # ---- faults --------------------------------------------------------------------------

    async def inject(self, fault: Fault, rng: random.Random, clock: Callable[[], float]) -> Injected:
        """Inject ``fault``; return when it was injected and when it was lifted."""
        if fault in (Fault.PG_CUT, Fault.AMQP_CUT, Fault.PG_STALL, Fault.AMQP_STALL):
            proxy = self.pg if fault in (Fault.PG_CUT, Fault.PG_STALL) else self.amqp
            assert proxy is not None
            at = clock()
            if fault in (Fault.PG_CUT, Fault.AMQP_CUT):
                proxy.cut()
            else:
                await proxy.stall(STALL)
            return Injected(fault, at, clock())
        if fault in (Fault.PG_RESTART, Fault.AMQP_RESTART):
            at = clock()
            await asyncio.to_thread(restart_postgres if fault is Fault.PG_RESTART else restart_rabbitmq)
            return Injected(fault, at, clock())
        kind = "brain" if fault.name.startswith("BRAIN") else "hands"
        live = [s for s in self.slots if s.kind == kind and s.proc.poll() is None]
        slot = rng.choice(live)
        target = f"{kind} pid {slot.proc.pid}"
        at = clock()
        if fault.name.endswith("KILL"):
            slot.proc.send_signal(signal.SIGKILL)
        elif fault.name.endswith("TERM"):
            slot.proc.send_signal(signal.SIGTERM)
        else:
            slot.proc.send_signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(FREEZE)
            finally:
                slot.proc.send_signal(signal.SIGCONT)
        return Injected(fault, at, clock(), target=target)


async def _up(url: str) -> bool:
    try:
        status, _ = await asyncio.to_thread(http_json, "GET", f"{url}/stats")
    except Exception:  # noqa: BLE001 - not up yet
        return False
    return status == 200


def local_services(database_url: str, amqp_url: str) -> list[str]:
    """Why the services cannot be restarted from here (empty: they can)."""
    why = []
    for name, url in (("PostgreSQL", database_url), ("RabbitMQ", amqp_url)):
        if urlsplit(url).hostname not in ("127.0.0.1", "localhost"):
            why.append(f"{name} is not on this machine")
    for tool in ("pg_ctlcluster", "pg_lsclusters", "rabbitmqctl"):
        if shutil.which(tool) is None:
            why.append(f"{tool} is not installed")
    return why


def restart_postgres() -> None:
    """Restart the local PostgreSQL cluster (fast shutdown: every session ends)."""
    version, cluster = subprocess.run(
        ["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=True
    ).stdout.split()[:2]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, cluster, "restart", "-m", "fast"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip


def restart_rabbitmq() -> None:
    """Stop and start the local RabbitMQ application (every connection ends; queues stay)."""
    for step in ("stop_app", "start_app"):
        subprocess.run(["rabbitmqctl", "-q", step], check=True, capture_output=True, timeout=120)
    subprocess.run(["rabbitmqctl", "-q", "await_startup"], check=True, capture_output=True, timeout=120)
    time.sleep(0.5)
