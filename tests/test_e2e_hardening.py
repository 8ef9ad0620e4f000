"""Faults an operator meets in production, against real processes on real services.

A frozen process (SIGSTOP: a long pause, a frozen VM, a half-open partition) keeps its
connections and locks: it is taken over once its lease ran out, and what it writes when it
wakes is refused. A live process whose phase outlasts a lease keeps it. A lost database
connection (cut by a TCP proxy, or a real restart of PostgreSQL) is ridden out by Brain and
Hands alike: the turn completes, nothing runs twice, and nothing becomes UNKNOWN that was not.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from chaos.proxy import TcpCutter
from infra.db import session_name
from infra.transport import Topology
from infra.transport.broker import Broker
from protocol import SucceededBody, SucceededEvent, encode, new_id
from tests import hands_test_tools as lab
from tests.hands_bus import SERVE, Bus, command, ledger_fetch, runs
from tests.support import Observer, Processes, TendonEnv, run_cli, wait_for

BRAIN = ["-m", "brain", "serve"]

pytestmark = pytest.mark.chaos


@pytest.fixture
def gates(world: TendonEnv, tmp_path: Path) -> Path:
    """Where the test opens the gates of ``gated`` bodies."""
    gate_dir = tmp_path / "gates"
    gate_dir.mkdir()
    world.extra["LAB_GATE_DIR"] = str(gate_dir)
    return gate_dir


@pytest.fixture
async def pg_cutter(world: TendonEnv) -> AsyncIterator[TcpCutter]:
    """A TCP proxy in front of PostgreSQL that can drop every connection through it."""
    async with TcpCutter(world.database_url) as proxy:
        yield proxy


async def _worker_id(processes: Processes, proc: subprocess.Popen[bytes]) -> str:
    """The worker id a ready Tendon process wrote into its ready file."""
    ready = Path(str(proc.log_path).removesuffix(".log") + ".ready")  # type: ignore[attr-defined]
    return (await asyncio.to_thread(ready.read_text)).strip()


async def _until(check: Callable[[], Any], what: str) -> Any:
    """Wait (bounded) until the plain function ``check`` returns something truthy."""

    async def checked() -> Any:
        return check()

    return await wait_for(checked, timeout=30, what=what)


async def _running(world: TendonEnv, tool: str, count: int = 1) -> list[tuple[str, str, int]]:
    """Wait until ``tool`` has entered its body ``count`` times; returns its runs."""

    async def entered() -> list[tuple[str, str, int]] | None:
        mine = [r for r in runs(world) if r[0] == tool]
        return mine if len(mine) >= count else None

    return await wait_for(entered, timeout=30, what=f"{tool} to run {count} time(s)")


async def _two_workers_one_running_slow(bus: Bus, processes: Processes, env: dict[str, str]) -> Any:
    """Two workers, one of them inside a safe tool that takes a few seconds: (the command,
    its started event, the worker running it, the other one)."""
    # Both are up before the command goes out: a worker started meanwhile on a slow machine could
    # take longer than the tool, which would end before the test acts on it.
    first = await processes.start_ready("hands", SERVE, env)
    second = await processes.start_ready("hands", SERVE, env)
    cmd = command(lab.slow, {"pages": 40, "delay": 0.1})
    await bus.publish_command(cmd)
    started = await bus.wait_kind(cmd.execution_id, "started")
    if started.body.worker == await _worker_id(processes, first):
        return cmd, started, first, second
    return cmd, started, second, first


def _agent(tmp_path: Path, script: list[dict[str, Any]], tools: list[str]) -> str:
    path = tmp_path / "agent.json"
    path.write_text(
        json.dumps(
            {
                "name": "hardening",
                "version": "1",
                "model": {"kind": "scripted", "script": script},
                "tools": tools,
            }
        )
    )
    return str(path)


async def _submit(env: dict[str, str], agent: str, request_id: str = "r1") -> str:
    code, out, err = await run_cli(
        ["-m", "brain", "submit", "--session", "s-hard", "--request-id", request_id, "--agent", agent, "go"],
        env,
    )
    assert code == 0, err
    return out.strip()


# ---- a frozen process is taken over; a live one keeps its work --------------------------


async def test_a_frozen_hands_worker_is_taken_over_after_its_lease_and_refused_when_it_wakes(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given two workers with a 2 s lease, one of which runs a safe tool that takes a while
    env = {**world.env, "TENDON_LEASE_SECONDS": "2"}
    cmd, started, owner, other = await _two_workers_one_running_slow(bus, processes, env)
    frozen_id = started.body.worker

    # When the owner freezes mid-body (SIGSTOP keeps its connections and its lock)
    owner.send_signal(signal.SIGSTOP)
    try:
        # Then the other worker takes the execution over once the lease ran out, by the replay
        # rule (a safe tool: run again, as attempt 2, under the new owner)
        rerun = await _until(
            lambda: next(
                (e for e in bus.events(cmd.execution_id) if e.kind == "started" and e.seq > 2), None
            ),
            "the takeover",
        )
        assert rerun.body.worker == await _worker_id(processes, other)
        assert (rerun.body.attempt, rerun.body.reason) == (2, "rerun_after_crash")
        dead = await ledger_fetch(
            world, "SELECT dead_at IS NOT NULL AS dead FROM workers WHERE id = $1", frozen_id
        )
        assert [r["dead"] for r in dead] == [True]
    finally:
        owner.send_signal(signal.SIGCONT)

    # When it wakes, what it still tries to write is refused (its ownership moved on), and it
    # starts over under a new worker id instead of working on
    await _until(lambda: "starting_over" in processes.output(owner), "a restart under a new id")
    final = await bus.wait_kind(cmd.execution_id, "succeeded")
    events = bus.by_seq(cmd.execution_id)
    assert sorted(events) == list(range(1, final.seq + 1))  # one contiguous sequence
    assert all(e.body.worker != frozen_id for s, e in events.items() if e.kind == "started" and s > 2)
    assert "liveness_lost" in processes.output(owner)
    assert owner.poll() is None
    rows = await ledger_fetch(world, "SELECT status, owner, attempts FROM executions")
    assert [tuple(r) for r in rows] == [("succeeded", await _worker_id(processes, other), 2)]


async def test_a_tool_frozen_before_its_side_effect_does_not_act_when_it_wakes_after_a_takeover(
    world: TendonEnv, bus: Bus, processes: Processes, gates: Path
) -> None:
    # Given two workers with a 2 s lease, one inside an unsafe tool waiting to act
    env = {**world.env, "TENDON_LEASE_SECONDS": "2"}
    first = await processes.start_ready("hands", SERVE, env)
    cmd = command(lab.gated_effect, {"gate": "act"})
    await bus.publish_command(cmd)
    started = await bus.wait_kind(cmd.execution_id, "started")
    await processes.start_ready("hands", SERVE, env)
    assert started.body.worker == await _worker_id(processes, first)

    # When it freezes there, is presumed dead (its execution UNKNOWN: no query, no re-run), and
    # wakes with the way to act open
    first.send_signal(signal.SIGSTOP)
    try:
        await bus.wait_kind(cmd.execution_id, "unknown")
        (gates / "act").touch()
    finally:
        first.send_signal(signal.SIGCONT)

    # Then it does not act: ctx.ensure_owner() stopped the body, and it starts over
    await _until(lambda: "starting_over" in processes.output(first), "a restart under a new id")
    await asyncio.sleep(0.5)
    assert runs(world) == []
    rows = await ledger_fetch(world, "SELECT status FROM executions")
    assert [r["status"] for r in rows] == ["unknown"]


async def test_a_frozen_brain_is_taken_over_after_its_lease_and_its_late_commit_is_refused(
    world: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    # Given two Brains with a 2 s lease, one of them running a turn whose model call takes 4 s
    # (both are up before the submit: a Brain started meanwhile on a slow machine could take
    # longer than the model call, which would end before the freeze)
    env = {**world.env, "TENDON_LEASE_SECONDS": "2"}
    obs = Observer(world)
    agent = _agent(tmp_path, [{"content": "slow answer", "delay": 4}], [])
    first = await processes.start_ready("brain", BRAIN, env)
    standby = await processes.start_ready("brain", BRAIN, env)
    turn_id = await _submit(env, agent)

    async def first_run() -> Any:
        runs = await obs.facts(turn_id, "turn.run_started")
        return runs[0]["owner"] if runs else None

    owner_id = await wait_for(first_run, timeout=30, what="the first run")
    owner, other = (first, standby) if owner_id == await _worker_id(processes, first) else (standby, first)
    # Its sessions (its pool, its liveness, its listener) are named after it
    assert await _sessions_of(world, owner_id) >= 3

    # When the owner freezes in the middle of its model call
    owner.send_signal(signal.SIGSTOP)
    try:
        # Then the standby takes the turn over after the lease and completes it, and the judgement
        # that presumed the owner dead ended every one of its sessions, frozen as they were
        turn = await obs.wait_turn(turn_id, "completed", timeout=40)
        assert await _sessions_of(world, owner_id) == 0
    finally:
        owner.send_signal(signal.SIGCONT)
    assert turn["result"] == {"text": "slow answer"}
    run_owners = [r["owner"] for r in await obs.facts(turn_id, "turn.run_started")]
    assert run_owners[0] == owner_id and run_owners[-1] == await _worker_id(processes, other)

    # And when the frozen Brain wakes, it finds itself presumed dead: its run is stopped or its
    # reply refused (fenced), nothing of it counts, and the process goes on under a new id
    await _until(lambda: "starting_over" in processes.output(owner), "a restart under a new id")
    assert [owner for owner, _ in await _model_calls(obs, turn_id)] == [await _worker_id(processes, other)]
    assert "liveness_lost" in processes.output(owner)
    assert owner.poll() is None


async def _sessions_of(world: TendonEnv, worker_id: str) -> int:
    """How many database sessions bear a worker's name."""
    named = "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = $1"
    rows = await ledger_fetch(world, named, session_name(worker_id))
    return int(rows[0]["n"])


async def _model_calls(obs: Observer, turn_id: str) -> list[tuple[str, dict[str, Any]]]:
    """(the Brain whose run committed it, its usage) of each model reply of a turn, from the journal."""
    entries = await obs.fetch(
        "SELECT run, facts FROM {brain}.journal WHERE turn_id = $1 ORDER BY seq", turn_id
    )
    owners = {f["epoch"]: f["owner"] for e in entries for f in e["facts"] if f["kind"] == "turn.run_started"}
    return [
        (owners[e["run"]], f["usage"])
        for e in entries
        for f in e["facts"]
        if f["kind"] == "turn.model_replied"
    ]


async def test_a_live_brain_keeps_a_turn_whose_model_call_outlasts_the_lease(
    world: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    # Given two Brains with a 1 s lease, and a model call that takes 3 s
    env = {**world.env, "TENDON_LEASE_SECONDS": "1"}
    obs = Observer(world)
    agent = _agent(tmp_path, [{"content": "worth the wait", "delay": 3}], [])
    brains = [await processes.start_ready("brain", BRAIN, env) for _ in range(2)]

    # When the turn runs
    turn_id = await _submit(env, agent)
    await obs.wait_turn(turn_id, "completed", timeout=40)

    # Then the Brain that claimed it kept it (it renewed the lease): one run, one model call
    assert len(await obs.facts(turn_id, "turn.run_started")) == 1
    assert len(await _model_calls(obs, turn_id)) == 1
    for brain in brains:
        assert "run_fenced_out" not in processes.output(brain)


# ---- a lost database connection is ridden out ---------------------------------------------


async def test_a_hands_worker_rides_out_cut_database_connections_and_saves_the_outcome_it_holds(
    world: TendonEnv, bus: Bus, processes: Processes, gates: Path, pg_cutter: TcpCutter
) -> None:
    # Given a worker whose ledger connections go through a proxy, a second worker (which would
    # take over the first one's work if it took it for dead), and an unsafe tool without a
    # query in flight on the first worker
    env = {**world.env, "TENDON_RECONNECT_GRACE": "3"}
    cut_off = await processes.start_ready("hands", SERVE, {**env, "TENDON_HANDS_DATABASE_URL": pg_cutter.url})
    cmd = command(lab.gated, {"gate": "g1"})
    await bus.publish_command(cmd)
    await _running(world, "gated")
    await processes.start_ready("hands", SERVE, env)

    # When every connection it has to PostgreSQL is cut, again and again, while the body runs
    # and as it saves its outcome
    for _ in range(3):
        pg_cutter.cut()
        await asyncio.sleep(0.5)
    (gates / "g1").touch()
    pg_cutter.cut()

    # Then it saves the outcome itself: the tool ran once, and nothing is UNKNOWN
    final = await bus.wait_kind(cmd.execution_id, "succeeded")
    assert final.body.result == {"acted": "g1", "attempt": 1}
    assert [r for r in runs(world) if r[0] == "gated"] == [("gated", cmd.execution_id, 1)]
    assert "unknown" not in [e.kind for e in bus.events(cmd.execution_id)]
    assert cut_off.poll() is None and pg_cutter.cuts == 4
    assert "starting_over" not in processes.output(cut_off)


async def test_a_turn_completes_through_cut_connections_of_its_brain_and_its_hands(
    world: TendonEnv, processes: Processes, gates: Path, pg_cutter: TcpCutter, tmp_path: Path
) -> None:
    # Given a Brain and a Hands worker that both reach PostgreSQL through a proxy, and a turn
    # whose model call is slow and whose unsafe tool (no query) waits at a gate
    env = {
        **world.env,
        "TENDON_RECONNECT_GRACE": "3",
        "TENDON_DATABASE_URL": pg_cutter.url,
    }
    obs = Observer(world)
    script = [
        {"tool_calls": [{"tool": "gated", "args": {"gate": "g2"}}], "delay": 1},
        {"content": "done: {results}", "delay": 1},
    ]
    brain = await processes.start_ready("brain", BRAIN, env)
    hands = await processes.start_ready("hands", SERVE, env)
    turn_id = await _submit(env, _agent(tmp_path, script, ["gated"]))

    # When their connections are cut during the model call, during the tool, and as the
    # outcome is saved and applied
    await asyncio.sleep(0.5)
    pg_cutter.cut()
    await _running(world, "gated")
    pg_cutter.cut()
    await asyncio.sleep(0.5)
    (gates / "g2").touch()
    pg_cutter.cut()
    await asyncio.sleep(0.5)
    pg_cutter.cut()

    # Then the turn completes, the tool ran once, nothing is UNKNOWN, and both lived through it
    turn = await obs.wait_turn(turn_id, "completed", timeout=60)
    assert "acted" in turn["result"]["text"]
    assert [r[0] for r in runs(world)] == ["gated"]
    (execution,) = await obs.executions(turn_id)
    assert (execution["status"], execution["how"]) == ("succeeded", "ran")
    assert brain.poll() is None and hands.poll() is None
    for proc in (brain, hands):
        assert "starting_over" not in processes.output(proc)


# ---- a real restart of PostgreSQL ---------------------------------------------------------


def _restart_postgres() -> None:
    """Restart the local PostgreSQL cluster (fast shutdown: every session is ended)."""
    if shutil.which("pg_ctlcluster") is None or shutil.which("pg_lsclusters") is None:
        message = "pg_ctlcluster is not available: cannot restart PostgreSQL here"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    version, cluster = subprocess.run(
        ["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=True
    ).stdout.split()[:2]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, cluster, "restart", "-m", "fast"],
        check=True,
        capture_output=True,
        timeout=120,
    )


@pytest.fixture
def local_postgres(world: TendonEnv) -> None:
    if "127.0.0.1" not in world.database_url and "localhost" not in world.database_url:
        pytest.skip("PostgreSQL is not this machine's: it is not restarted by tests")


# It runs alone (``restarts_services``): under -n, it first waits for the other workers' tests.
@pytest.mark.restarts_services
@pytest.mark.timeout(600)
async def test_a_turn_completes_across_a_real_postgresql_restart_in_the_middle_of_its_tool(
    world: TendonEnv, processes: Processes, gates: Path, tmp_path: Path, local_postgres: None
) -> None:
    # Given a Brain and two Hands workers, and a turn whose unsafe tool (no query) is in flight
    env = {**world.env, "TENDON_RECONNECT_GRACE": "3"}
    obs = Observer(world)
    script = [{"tool_calls": [{"tool": "gated", "args": {"gate": "g3"}}]}, {"content": "done: {results}"}]
    brain = await processes.start_ready("brain", BRAIN, env)
    workers = [await processes.start_ready("hands", SERVE, env) for _ in range(2)]
    turn_id = await _submit(env, _agent(tmp_path, script, ["gated"]))
    await _running(world, "gated")

    # When PostgreSQL restarts, every session of every process ended by it
    await asyncio.to_thread(_restart_postgres)
    (gates / "g3").touch()

    # Then the turn completes: the tool ran once, its outcome saved by the worker that ran
    # it, nothing UNKNOWN, and every process lived through it without starting over
    turn = await obs.wait_turn(turn_id, "completed", timeout=90)
    assert "acted" in turn["result"]["text"]
    assert [r[0] for r in runs(world)] == ["gated"]
    (execution,) = await obs.executions(turn_id)
    assert (execution["status"], execution["how"], execution["attempts"]) == ("succeeded", "ran", 1)
    for proc in (brain, *workers):
        assert proc.poll() is None, processes.output(proc)
        assert "starting_over" not in processes.output(proc)
    dead = await ledger_fetch(world, "SELECT count(*) AS n FROM workers WHERE dead_at IS NOT NULL")
    assert dead[0]["n"] == 0
    assert await obs.orphans() == {}


# ---- what cannot go on ends visibly, and settles what it leaves -----------------------------


async def test_an_update_parked_for_good_fails_its_turn_settles_its_execution_and_nothing_asks_forever(
    world: TendonEnv, processes: Processes, gates: Path, tmp_path: Path
) -> None:
    # Given a turn whose unsafe tool runs at a gate, a Brain that parks an update after two
    # deliveries and nudges a stalled execution after 1 s
    env = {**world.env, "TENDON_DELIVERY_LIMIT": "2", "TENDON_STALL_SECONDS": "1"}
    obs = Observer(world)
    brain = await processes.start_ready("brain", BRAIN, env)
    await processes.start_ready("hands", SERVE, env)
    script = [{"tool_calls": [{"tool": "gated", "args": {"gate": "g4"}}]}, {"content": "done"}]
    turn_id = await _submit(env, _agent(tmp_path, script, ["gated"]))
    await _running(world, "gated")

    async def running() -> Any:
        rows = await obs.executions(turn_id)
        return rows[0] if rows and rows[0]["status"] == "running" else None

    execution = await wait_for(running, timeout=30, what="the execution running")

    # When an update for it arrives that the Brain can never apply (PostgreSQL refuses its
    # result), authentic in every other way
    poison = SucceededEvent(
        execution_id=execution["id"],
        namespace="default",
        session_id="s-hard",
        request_digest=execution["request_digest"],
        seq=execution["last_seq"] + 1,
        body=SucceededBody(result={"text": "a\x00b"}),
    )
    await _publish(world, f"{world.prefix}.updates", encode(poison), delivery_limit=2)

    # Then, parked after its deliveries, it is read back and fails the turn, saying why...
    turn = await obs.wait_turn(turn_id, "failed", timeout=60)
    assert turn["error"]["code"] == "parked"
    assert f"update succeeded #{poison.seq} of execution {execution['id']}" in turn["error"]["message"]
    assert "delivery limit" in turn["error"]["message"]
    code, out, err = await run_cli(["-m", "brain", "parked", "--json"], env)
    assert code == 0, err
    (parked,) = json.loads(out)
    assert parked["surfaced"].startswith(f"turn {turn_id} failed")
    code, out, _ = await run_cli(["-m", "brain", "parked", str(parked["id"])], env)
    assert code == 0 and '"a\\u0000b"' in out

    # ...its execution is settled on both sides: cancelled here, and the Hands told...
    (settled,) = await obs.executions(turn_id)
    assert settled["status"] == "cancelled" and "turn ended first" in settled["error"]["message"]

    async def hands_told() -> bool:
        rows = await ledger_fetch(world, "SELECT cancel_requested FROM executions")
        return bool(rows) and rows[0]["cancel_requested"]

    await wait_for(hands_told, timeout=30, what="the Hands told to cancel")

    # ...and nothing asks about it any more: no replay requests, however long it stays quiet
    # (the tool, which ignores cancels, finishing later changes nothing here either)
    failed_at = len(processes.output(brain))
    await asyncio.sleep(3.5)  # more than three stall periods
    (gates / "g4").touch()
    await _until(lambda: "late_event" in processes.output(brain), "the tool's late outcome")
    assert "replay_requested" not in processes.output(brain)[failed_at:]
    assert (await obs.turn(turn_id))["status"] == "failed"

    # The late outcome is kept beside the settled status: a cancel is only a request, and the
    # record must not hide that the tool acted after all
    async def noted() -> Any:
        (row,) = await obs.executions(turn_id)
        return row if row["how"] == "ran" else None

    late = await wait_for(noted, timeout=30, what="the late outcome noted")
    assert late["status"] == "cancelled" and late["result"] == {"acted": "g4", "attempt": 1}
    assert late["error"]["message"].endswith("afterwards its Hands reported it succeeded (ran)")


async def _publish(world: TendonEnv, queue: str, body: bytes, *, delivery_limit: int) -> None:
    """Publish as a process declaring the queues with this delivery limit would."""
    async with Broker(world.amqp_url, Topology(world.prefix), delivery_limit=delivery_limit) as broker:
        await broker.publish(queue, body, message_id=new_id())


# ---- a killed process is seen at once: its broker connection went with it ----------------------


async def test_a_killed_hands_worker_is_taken_over_at_once_not_after_the_grace(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given two workers that would give a lost database session 30 s to come back, and a safe
    # tool running on one of them
    env = {**world.env, "TENDON_RECONNECT_GRACE": "30"}
    cmd, started, owner, _ = await _two_workers_one_running_slow(bus, processes, env)

    # When the owner is killed (its database session and its broker connection end together)
    owner.send_signal(signal.SIGKILL)

    # Then the other worker takes the execution over long before the grace: the broker no
    # longer sees the owner, so its lost lock is a death, not a reconnect
    rerun = await _until(
        lambda: next((e for e in bus.events(cmd.execution_id) if e.kind == "started" and e.seq > 2), None),
        "the takeover (well within the 30 s grace)",
    )
    assert rerun.body.worker != started.body.worker and rerun.body.reason == "rerun_after_crash"
    await bus.wait_kind(cmd.execution_id, "succeeded")
