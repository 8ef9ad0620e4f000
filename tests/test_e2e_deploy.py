"""Deploying Tendon, against real processes on the local services: servers started before their
services wait for them and then serve; SIGTERM drains (a Brain's run reaches its next commit, a
Hands worker finishes its tools or hands them back after ``TENDON_DRAIN_SECONDS``); a rolling
restart of every process under load loses nothing and runs nothing twice."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from brain import verbs
from brain.rules.agents import AgentDefinition
from brain.store import open_store, wake_channel
from chaos.proxy import TcpCutter
from tests.support import Observer, Processes, TendonEnv, free_port, run_cli, wait_for

BRAIN = ["-m", "brain", "serve"]
HANDS = ["-m", "hands", "serve", "--route", "bulk", "--tools", "tests.brain_e2e_tools"]

pytestmark = pytest.mark.chaos


@pytest.fixture
def env(tendon: TendonEnv, tmp_path: Path) -> dict[str, str]:
    tendon.routes.add("bulk")
    return {**tendon.env, "BULK_RUNS_FILE": str(tmp_path / "runs.txt")}


@pytest.fixture
def obs(tendon: TendonEnv) -> Observer:
    return Observer(tendon)


def _agent(script: list[dict[str, Any]], tools: tuple[str, ...] = ("slow_step",)) -> dict[str, Any]:
    return {
        "name": "deploy",
        "version": "1",
        "tools": list(tools),
        "model": {"kind": "scripted", "script": script},
    }


def _runs(env: dict[str, str]) -> list[str]:
    path = Path(env["BULK_RUNS_FILE"])
    return path.read_text().splitlines() if path.exists() else []


async def _submit(env: dict[str, str], tmp_path: Path, agent: dict[str, Any], session: str = "s") -> str:
    path = tmp_path / f"agent-{session}.json"
    path.write_text(json.dumps(agent))
    code, out, err = await run_cli(
        ["-m", "brain", "submit", "--session", session, "--request-id", "r1", "--agent", str(path), "go"], env
    )
    assert code == 0, err
    return out.strip()


async def _model_replies(obs: Observer, turn_id: str) -> list[str]:
    """The owner of the run that committed each model reply of a turn."""
    entries = await obs.fetch(
        "SELECT run, facts FROM {brain}.journal WHERE turn_id = $1 ORDER BY seq", turn_id
    )
    owners = {f["epoch"]: f["owner"] for e in entries for f in e["facts"] if f["kind"] == "turn.run_started"}
    return [owners[e["run"]] for e in entries for f in e["facts"] if f["kind"] == "turn.model_replied"]


async def _worker_id(proc: subprocess.Popen[bytes]) -> str:
    ready = Path(str(proc.log_path).removesuffix(".log") + ".ready")  # type: ignore[attr-defined]
    return (await asyncio.to_thread(ready.read_text)).strip()


async def _says(processes: Processes, proc: subprocess.Popen[bytes], text: str) -> None:
    async def said() -> bool:
        assert proc.poll() is None, processes.output(proc)
        return text in processes.output(proc)

    await wait_for(said, timeout=60, what=f"{text!r} in the log of pid {proc.pid}")


async def _exists(path: Path, *, what: str) -> None:
    async def there() -> bool:
        return await asyncio.to_thread(path.exists)

    await wait_for(there, timeout=60, what=what)


def _at_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}127.0.0.1:{port}"))


# ---- a served process's heap ----------------------------------------------------------------


async def test_served_processes_take_what_start_up_built_out_of_the_collector(
    env: dict[str, str], processes: Processes
) -> None:
    # A Brain and a Hands worker, once ready, freeze the objects start-up built (infra.process.heap):
    # full collections then walk only what serving made, not the modules and the validators.
    for name, args in (("brain", BRAIN), ("hands", HANDS)):
        proc = await processes.start_ready(name, args, env)
        await _says(processes, proc, "heap_settled")
        line = next(ln for ln in processes.output(proc).splitlines() if "heap_settled" in ln)
        settled = json.loads(line)
        assert settled["frozen_objects"] > 20_000, line
        assert settled["young_collection_every"] == 10_000, line


# ---- containers start in any order ---------------------------------------------------------


async def test_servers_started_before_their_services_wait_for_them_say_so_and_then_serve(
    env: dict[str, str], processes: Processes, tmp_path: Path
) -> None:
    # Given a Brain whose PostgreSQL, and a Hands worker whose object store and RabbitMQ, are not
    # there yet (nothing listens on their ports)
    db_port, s3_port, amqp_port = free_port(), free_port(), free_port()
    brain_env = {**env, "TENDON_DATABASE_URL": _at_port(env["TENDON_DATABASE_URL"], db_port)}
    hands_env = {
        **env,
        "TENDON_S3_ENDPOINT_URL": _at_port(env["TENDON_S3_ENDPOINT_URL"], s3_port),
        "TENDON_AMQP_URL": _at_port(env["TENDON_AMQP_URL"], amqp_port),
    }
    brain = processes.start("brain", BRAIN, {**brain_env, "TENDON_READY_FILE": str(tmp_path / "brain.ready")})
    hands = processes.start("hands", HANDS, {**hands_env, "TENDON_READY_FILE": str(tmp_path / "hands.ready")})

    # Then each says what it waits for, where, and keeps waiting instead of exiting
    await _says(processes, brain, f'"service": "PostgreSQL", "at": "127.0.0.1:{db_port}"')
    await _says(processes, hands, f'"service": "the object store", "at": "127.0.0.1:{s3_port}"')
    async with TcpCutter(env["TENDON_S3_ENDPOINT_URL"], port=s3_port):
        await _says(processes, hands, f'"service": "RabbitMQ", "at": "127.0.0.1:{amqp_port}"')
        async with (
            TcpCutter(env["TENDON_AMQP_URL"], port=amqp_port),
            TcpCutter(env["TENDON_DATABASE_URL"], port=db_port),
        ):
            # When the services come up, both get ready and a turn runs through them
            for name in ("brain", "hands"):
                await _exists(tmp_path / f"{name}.ready", what=f"{name} to be ready")
            turn = await _submit(
                brain_env,
                tmp_path,
                _agent(
                    [{"tool_calls": [{"tool": "slow_step", "args": {"seconds": 0.1}}]}, {"content": "ok"}]
                ),
            )
            code, out, err = await run_cli(["-m", "brain", "wait", turn, "--timeout", "60"], brain_env)
            assert code == 0 and "completed" in out, out + err
            await asyncio.to_thread(processes.stop_all)  # before the proxies go


async def test_a_login_the_database_refuses_is_not_waited_for(env: dict[str, str]) -> None:
    # Given `hands serve` (which waits forever for a database that is away) and a role the
    # database does not have: that is a configuration error, not a service still starting
    parts = urlsplit(env["TENDON_DATABASE_URL"])
    host = parts.netloc.rsplit("@", 1)[-1]
    bad = {**env, "TENDON_DATABASE_URL": urlunsplit(parts._replace(netloc=f"no_such_tendon_role@{host}"))}

    # Then it exits at once with one clear line
    code, _, err = await run_cli(HANDS[:1] + HANDS[1:], bad, timeout=60)
    assert code == 2, err
    assert "hands: the database refused the login" in err and "Traceback" not in err


# ---- graceful drain ------------------------------------------------------------------------


async def test_a_brain_stopped_mid_model_call_commits_the_reply_before_it_hands_the_turn_over(
    env: dict[str, str], obs: Observer, processes: Processes, tmp_path: Path
) -> None:
    # Given a Brain in the middle of a model call that takes 3 s
    first = await processes.start_ready("brain", BRAIN, env)
    await processes.start_ready("hands", HANDS, env)
    step = {"tool_calls": [{"tool": "slow_step", "args": {"seconds": 0.1}}], "delay": 3}
    turn = await _submit(env, tmp_path, _agent([step, {"content": "done"}]))

    async def run_started() -> list[dict[str, Any]]:
        return await obs.facts(turn, "turn.run_started")

    await wait_for(run_started, timeout=30, what="the first run")
    first_id = await _worker_id(first)  # (the ready file goes at exit)

    # When it is told to stop (SIGTERM) during the call, and a standby Brain starts meanwhile
    # (started first, it could have claimed the turn; started later, the call could be over)
    first.send_signal(signal.SIGTERM)
    standby = await processes.start_ready("brain", BRAIN, env)
    ids = [first_id, await _worker_id(standby)]

    # Then it lets the call finish and commits the reply before it exits, so the model is asked
    # once (not a lost call asked again by the standby), and the standby completes the turn
    assert await processes.wait_exit(first, timeout=30) == 0
    assert "brain_drained" in processes.output(first)
    done = await obs.wait_turn(turn, "completed", timeout=60)
    assert done["result"] == {"text": "done"}
    assert await _model_replies(obs, turn) == ids
    assert [line.split()[1] for line in _runs(env)] == ["started", "finished"]


async def test_a_hands_worker_stopped_mid_tool_finishes_it_before_it_exits(
    env: dict[str, str], obs: Observer, processes: Processes, tmp_path: Path
) -> None:
    # Given a Hands worker running a 2 s tool
    await processes.start_ready("brain", BRAIN, env)
    worker = await processes.start_ready("hands", HANDS, env)
    turn = await _submit(env, tmp_path, _agent([_step(2.0), {"content": "done"}]))
    await wait_for(lambda: _started(env), timeout=30, what="the tool to start")

    # When it is told to stop (SIGTERM)
    worker.send_signal(signal.SIGTERM)

    # Then the tool runs to its end, its outcome reaches the Brain, and the worker exits 0
    assert await processes.wait_exit(worker, timeout=30) == 0
    await processes.start_ready("hands", HANDS, env)  # only for what comes after, if anything
    done = await obs.wait_turn(turn, "completed", timeout=60)
    assert done["result"] == {"text": "done"}
    assert [line.split()[1] for line in _runs(env)] == ["started", "finished"]
    assert [(r["status"], r["attempts"]) for r in await obs.ledger()] == [("succeeded", 1)]


async def test_a_tool_that_outlasts_the_drain_is_handed_back_and_run_again_by_the_pool(
    env: dict[str, str], obs: Observer, processes: Processes, tmp_path: Path
) -> None:
    # Given two Hands workers with a drain of half a second, one of them running a safe tool that
    # goes on until the test opens its gate (however slow the machine, it is still running)
    env = {**env, "TENDON_DRAIN_SECONDS": "0.5"}
    gate = tmp_path / "gate"
    await processes.start_ready("brain", BRAIN, env)
    first = await processes.start_ready("hands", HANDS, env)
    step = {"tool_calls": [{"tool": "slow_step", "args": {"seconds": 600.0, "gate": str(gate)}}]}
    turn = await _submit(env, tmp_path, _agent([step, {"content": "done"}]))
    await wait_for(lambda: _started(env), timeout=30, what="the tool to start")
    await processes.start_ready("hands", HANDS, env)

    # When the worker running it is told to stop
    first.send_signal(signal.SIGTERM)

    # Then it exits once the drain ran out, and the other worker takes the execution over by
    # the replay rule (a safe tool: run again, to its end)
    assert await processes.wait_exit(first, timeout=30) == 0
    await wait_for(lambda: _started(env, times=2), timeout=60, what="the tool to run again")
    gate.touch()
    done = await obs.wait_turn(turn, "completed", timeout=60)
    assert done["result"] == {"text": "done"}
    assert [line.split()[1] for line in _runs(env)] == ["started", "started", "finished"]
    assert [(r["status"], r["attempts"]) for r in await obs.ledger()] == [("succeeded", 2)]


def _step(seconds: float, label: str = "step") -> dict[str, Any]:
    return {"tool_calls": [{"tool": "slow_step", "args": {"seconds": seconds, "label": label}}]}


async def _started(env: dict[str, str], times: int = 1) -> bool:
    return sum(" started " in line for line in _runs(env)) >= times


# ---- a rolling restart under load ---------------------------------------------------------


async def test_a_rolling_restart_of_every_process_under_load_loses_nothing_and_runs_nothing_twice(
    tendon: TendonEnv, env: dict[str, str], obs: Observer, processes: Processes
) -> None:
    # Given two Brains and two Hands workers, and turns coming in all the time, each a model
    # call that takes a moment, a tool that takes a second, and a last reply
    brains = [await processes.start_ready("brain", BRAIN, env) for _ in range(2)]
    hands = [await processes.start_ready("hands", HANDS, env) for _ in range(2)]
    agent = AgentDefinition.model_validate(
        _agent([{**_step(1.0, "load"), "delay": 0.3}, {"content": "done", "delay": 0.3}])
    )
    settings = tendon.settings()
    store = await open_store(settings)
    turns: list[str] = []

    async def load() -> None:
        for i in range(30):
            turn, _ = await verbs.submit(
                store, namespace=settings.namespace, session_id=f"s{i}", request_id="r",
                user_input="go", agent=agent, wake_channel=wake_channel(settings),
            )  # fmt: skip
            turns.append(turn)
            await asyncio.sleep(0.4)

    try:
        submitting = asyncio.create_task(load())
        # When every process in turn is told to stop (SIGTERM), drains, exits and is replaced
        for pool, args in ((hands, HANDS), (brains, BRAIN), (hands, HANDS), (brains, BRAIN)):
            await asyncio.sleep(1.0)
            old = pool.pop(0)
            old.send_signal(signal.SIGTERM)
            assert await processes.wait_exit(old, timeout=40) == 0, processes.output(old)
            pool.append(await processes.start_ready(args[1], args, env, timeout=60))
        await submitting

        # Then every turn completes, each tool ran once to its end, each model call was made once
        for turn in turns:
            done = await obs.wait_turn(turn, "completed", timeout=120)
            assert done["result"] == {"text": "done"}
            assert len(await _model_replies(obs, turn)) == 2
    finally:
        await store.close()
    lines = Counter(tuple(line.split()[:2]) for line in _runs(env))
    assert lines == {("load", "started"): 30, ("load", "finished"): 30}, lines
    assert len({line.split()[2] for line in _runs(env)}) == 30  # 30 executions, each once
    assert Counter(r["status"] for r in await obs.ledger()) == {"succeeded": 30}
    assert await obs.orphans() == {}
