"""The executor and the recovery scan in this process, on a real PostgreSQL ledger.

No broker is needed: the relay is never run, and these tests read the events from the ledger. The
worker is registered for real (advisory-lock liveness), so "dead owner" and "this live
worker" mean what they mean in production.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hands.rules.states import OPEN_STATUSES, LedgerStatus
from hands.run.executor import Executor
from hands.run.outcomes import Outcomes
from hands.run.recovery import RecoveryScanner
from hands.run.relay import stored_events
from hands.run.tasks import Tasks
from hands.run.writer import LedgerWriter
from hands.store import MIGRATIONS, Execution, Ledger, NewExecution, ledger_for
from hands.tools.registry import ToolRegistry, load_tools
from infra.db import create_pool, migrate
from infra.liveness.registrations import WorkerRegistration
from infra.objects.payloads import PayloadCodec
from infra.process.killpoints import KillPoints
from protocol import UnknownEvent, new_id
from tests import hands_test_tools as tools
from tests.hands_pg_proxy import CommitCutter
from tests.support import TendonEnv, wait_for


@dataclass
class Lab:
    ledger: Ledger
    registry: ToolRegistry
    executor: Executor
    scanner: RecoveryScanner
    runs_file: Path
    charges_file: Path

    @property
    def me(self) -> str:
        return self.executor.tasks.worker_id

    async def add(self, tool: str, args: dict[str, Any], status: LedgerStatus, owner: str) -> str:
        """An execution row as a worker would have left it; returns its id."""
        served = self.registry.get(tool)
        assert served is not None
        execution_id = new_id()
        values = {
            "execution_id": execution_id,
            "route": "lab",
            "request_digest": "d" * 64,
            "namespace": "tests",
            "session_id": "s1",
            "turn_id": "t1",
            "call_id": f"call-{execution_id[:6]}",
            "tool": tool,
            "binding_digest": served.binding.digest,
            "replay_policy": served.binding.replay_policy.value,
            "args": args,
            "status": status,
            "owner": owner,
            "attempts": 0 if status is LedgerStatus.ACCEPTED else 1,
        }

        # As the worker left it: its events so far are not what these tests look at.
        (row,) = await self.ledger.transact(lambda conn: self.ledger.insert(conn, [NewExecution(values, [])]))
        assert row is not None
        return execution_id

    async def settled(self, execution_id: str) -> Execution:
        """Wait until the execution is no longer open; return its row."""

        async def closed() -> Execution | None:
            row = await self.ledger.read(lambda conn: self.ledger.get(conn, execution_id))
            return row if row is not None and row.status not in OPEN_STATUSES else None

        row: Execution = await wait_for(closed, timeout=10, what=f"{execution_id} to be closed")
        return row

    async def events(self, execution_id: str) -> list[dict[str, Any]]:
        return await self.ledger.read(lambda conn: stored_events(self.ledger, conn, execution_id, 1))

    async def event_kinds(self, execution_id: str) -> list[tuple[int, str]]:
        return [(e["seq"], e["kind"]) for e in await self.events(execution_id)]

    async def last_event(self, execution_id: str) -> Any:
        return UnknownEvent.model_validate((await self.events(execution_id))[-1])

    def runs(self) -> list[tuple[str, str, int]]:
        return tools.runs(self.runs_file)


@asynccontextmanager
async def _lab(
    tendon: TendonEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dsn: str
) -> AsyncIterator[Lab]:
    """An executor and scanner of route lab whose ledger pool connects to ``dsn``."""
    runs_file, charges_file = tmp_path / "runs.txt", tmp_path / "charges.json"
    monkeypatch.setenv("LAB_RUNS_FILE", str(runs_file))
    monkeypatch.setenv("LAB_CHARGES_FILE", str(charges_file))
    settings = tendon.settings()
    schema = settings.hands_schema
    pool = await create_pool(dsn, schema, max_size=6)
    try:
        await migrate(pool, schema, MIGRATIONS)
        ledger = ledger_for(pool)
        # A lease no test outlives: the keeper renews (and so notices a death recorded by a test)
        # only every third of it, as a worker that was cut off sees nothing for a while.
        registration = WorkerRegistration(tendon.database_url, schema, "hands", lease_seconds=600)
        async with registration:
            registry = load_tools("tests.hands_test_tools", "lab")
            # No relay: what the commits hand over is dropped; the events are in the ledger.
            writer = LedgerWriter(ledger, PayloadCodec(None, 1024 * 1024), lambda events: None)
            tasks = Tasks(registration.worker_id, concurrency=4)
            executor = Executor(
                tasks=tasks,
                outcomes=Outcomes(tasks, ledger=ledger, writer=writer),
                writer=writer,
                registry=registry,
                kill=KillPoints(),
                confirm_owner=registration.confirm,
            )
            scanner = RecoveryScanner(
                route="lab", ledger=ledger, tasks=tasks, executor=executor, interval=0.2
            )
            yield Lab(ledger, registry, executor, scanner, runs_file, charges_file)
            await tasks.drain(5.0)
    finally:
        await pool.close()


@pytest.fixture
async def lab(tendon: TendonEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Lab]:
    async with _lab(tendon, tmp_path, monkeypatch, tendon.database_url) as lab:
        yield lab


@pytest.fixture
async def proxy(tendon: TendonEnv) -> AsyncIterator[CommitCutter]:
    async with CommitCutter(tendon.database_url) as proxy:
        yield proxy


@pytest.fixture
async def cut_lab(
    tendon: TendonEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, proxy: CommitCutter
) -> AsyncIterator[Lab]:
    """A lab whose ledger connections go through ``proxy``."""
    async with _lab(tendon, tmp_path, monkeypatch, proxy.dsn) as lab:
        yield lab


async def test_a_result_postgresql_refuses_fails_the_execution_as_bad_result_not_left_running(
    lab: Lab,
) -> None:
    # Given an accepted execution of a tool whose result holds a NUL (valid JSON; jsonb refuses
    # it), left by a dead worker
    execution_id = await lab.add("nul_result", {"text": "hi"}, LedgerStatus.ACCEPTED, "dead-worker")

    # When this worker claims it, runs the body and tries to save the result
    assert await lab.scanner.scan_once() == 1
    row = await lab.settled(execution_id)

    # Then the execution is FAILED with code bad_result, saying why, and the body ran once
    assert row.status is LedgerStatus.FAILED and row.owner == lab.me
    assert row.error is not None and row.error["code"] == "bad_result"
    assert row.error["message"].startswith("the tool ran, but its outcome could not be saved:")
    assert "unsupported Unicode escape sequence" in row.error["message"]
    assert await lab.event_kinds(execution_id) == [(1, "started"), (2, "failed")]
    assert lab.runs() == [("nul_result", execution_id, 1)]


async def test_an_error_message_with_a_nul_is_saved_escaped_as_the_tools_failure(lab: Lab) -> None:
    # Given a tool that raises with a NUL in its message
    execution_id = await lab.add(
        "boom", {"message": "disk", "nul": True}, LedgerStatus.ACCEPTED, "dead-worker"
    )

    # When it runs
    assert await lab.scanner.scan_once() == 1
    row = await lab.settled(execution_id)

    # Then its failure is saved as the tool's error, the NUL written out as text
    assert row.status is LedgerStatus.FAILED
    assert row.error == {"code": "tool_error", "message": "ValueError: disk\\x00"}


async def test_a_query_answer_postgresql_refuses_leaves_the_execution_unknown_and_never_reruns_it(
    lab: Lab,
) -> None:
    # Given unsafe tool charge, left RUNNING by a dead worker, whose charges service has a
    # receipt for the operation that the ledger cannot store
    execution_id = await lab.add("charge", {"amount": 5}, LedgerStatus.RUNNING, "dead-worker")
    lab.charges_file.write_text(json.dumps({execution_id: {"charge_id": "ch\x00"}}), encoding="utf-8")

    # When this worker takes it over and its query finds the original charge
    assert await lab.scanner.scan_once() == 1
    row = await lab.settled(execution_id)

    # Then, since QUERYING cannot become FAILED and nothing is guessed, it is UNKNOWN
    assert row.status is LedgerStatus.UNKNOWN
    assert row.error is not None and "could not be saved" in row.error["message"]
    unknown = await lab.last_event(execution_id)
    assert unknown.kind == "unknown" and "took effect is not on record" in unknown.body.reason
    assert lab.runs() == []


@pytest.mark.parametrize(
    ("tool", "status", "expected"),
    [
        # never started: it never will
        ("charge", LedgerStatus.ACCEPTED, LedgerStatus.CANCELLED),
        # a safe body cut short: not run again, since nobody wants it any more
        ("echo", LedgerStatus.RUNNING, LedgerStatus.CANCELLED),
        # an unsafe body cut short whose query finds no trace: QUERYING -> CANCELLED
        ("charge", LedgerStatus.RUNNING, LedgerStatus.CANCELLED),
        # one that cannot be asked: nothing is guessed
        ("charge_noquery", LedgerStatus.RUNNING, LedgerStatus.UNKNOWN),
    ],
)
async def test_an_orphan_whose_cancel_was_asked_for_is_cancelled_not_run(
    lab: Lab, tool: str, status: LedgerStatus, expected: LedgerStatus
) -> None:
    # Given an execution left by a dead worker after a cancel was asked for (its turn ended)
    args = {"text": "late"} if tool == "echo" else {"amount": 5}
    execution_id = await lab.add(tool, args, status, "dead-worker")
    await lab.ledger.transact(lambda conn: lab.ledger.request_cancel(conn, execution_id))

    # When this worker takes it over
    assert await lab.scanner.scan_once() == 1

    # Then the replay rule ends it without running the body again
    row = await lab.settled(execution_id)
    assert row.status is expected
    assert lab.runs() == []


async def test_open_rows_of_this_live_worker_with_no_task_here_are_adopted_by_its_own_scan(
    lab: Lab,
) -> None:
    # Given rows this (live) worker owns but has no task for, as an accept or a release whose
    # commit outcome was unclear leaves them: one never started, one inside an unsafe body
    accepted = await lab.add("echo", {"text": "mine"}, LedgerStatus.ACCEPTED, lab.me)
    running = await lab.add("charge_noquery", {"amount": 3}, LedgerStatus.RUNNING, lab.me)

    # When its recovery scan runs
    assert await lab.scanner.scan_once() == 2

    # Then the replay rule applies as for an orphan: the first starts and succeeds, the
    # second becomes UNKNOWN (never re-run)
    done = await lab.settled(accepted)
    assert done.status is LedgerStatus.SUCCEEDED and done.result == {"text": "mine", "attempt": 1}
    assert (await lab.settled(running)).status is LedgerStatus.UNKNOWN
    assert lab.runs() == [("echo", accepted, 1)]

    # And a row that has a task here is left alone by the next scan
    assert await lab.scanner.scan_once() == 0


@pytest.mark.parametrize(
    ("cut", "pages"),
    [("start", 1), ("page", 1), ("outcome", 1), ("start", 0), ("outcome", 0)],
)
async def test_a_commit_whose_outcome_was_unclear_but_landed_is_not_repeated(
    cut_lab: Lab, proxy: CommitCutter, cut: str, pages: int
) -> None:
    # Given an execution left by a dead worker, and a ledger connection that loses the answer
    # to one commit of its run (the commit lands; the worker sees its connection lost, so
    # the outcome is unknown to it). The start and the outcome are one statement each that
    # commits alone; the claim and a page are transactions.
    lab = cut_lab
    execution_id = await lab.add("slow", {"pages": pages, "delay": 0}, LedgerStatus.ACCEPTED, "dead-worker")
    # Its commits: the claim, the start, the page (if any), the outcome.
    order = ["claim", "start"] + ["page"] * pages + ["outcome"]
    proxy.arm(skip=order.index(cut), cut=1)

    # When this worker claims and runs it
    assert await lab.scanner.scan_once() == 1
    row = await lab.settled(execution_id)

    # Then that commit happened exactly once: one attempt, each page once, one outcome
    assert proxy.cuts == 1
    assert row.status is LedgerStatus.SUCCEEDED and row.attempts == 1 and row.output_bytes == 7 * pages
    kinds = ["started"] + ["output_page"] * pages + ["succeeded"]
    assert await lab.event_kinds(execution_id) == list(enumerate(kinds, start=1))
    assert lab.runs() == [("slow", execution_id, 1)]


async def test_a_worker_whose_execution_was_handed_over_does_not_act_when_ensure_owner_asks(
    tendon: TendonEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    monkeypatch.setenv("LAB_GATE_DIR", str(gates))
    async with (
        _lab(tendon, tmp_path, monkeypatch, tendon.database_url) as first,
        _lab(tendon, tmp_path, monkeypatch, tendon.database_url) as second,
    ):
        # Given a worker inside the body of an unsafe tool (with a query), waiting to act, its
        # lease fresh (renewed a moment ago, valid for minutes)
        execution_id = await first.add(
            "gated_charge", {"amount": 7, "gate": "act"}, LedgerStatus.ACCEPTED, "dead-worker"
        )
        assert await first.scanner.scan_once() == 1

        async def attempt(n: int) -> bool:
            row = await first.ledger.read(lambda conn: first.ledger.get(conn, execution_id))
            return row is not None and row.status is LedgerStatus.RUNNING and row.attempts == n

        await wait_for(lambda: attempt(1), timeout=10, what="the first worker's body")

        # When the others presume it dead another way than by its lease (a lost database session
        # not taken again within the grace), and hand its execution over in the same transaction,
        # as a judgement does; the other worker's query finds no charge and runs it again
        async def judged(conn: Any) -> None:
            await conn.execute("UPDATE workers SET dead_at = now() WHERE id = $1", first.me)
            await first.ledger.release_owners(conn, [first.me])

        await first.ledger.transact(judged)
        assert await second.scanner.scan_once() == 1
        await wait_for(lambda: attempt(2), timeout=10, what="the second worker's re-run")
        (gates / "act").touch()

        # Then only the owner acts: the first worker's ensure_owner() refuses, though its lease
        # is fresh, and the charge happens once
        row = await second.settled(execution_id)

        async def first_idle() -> bool:
            return first.executor.tasks.in_flight == 0

        await wait_for(first_idle, timeout=10, what="the first worker's body to end")
        assert row.status is LedgerStatus.SUCCEEDED and row.owner == second.me and row.attempts == 2
        assert second.runs() == [("gated_charge", execution_id, 2)]
        assert list(json.loads(second.charges_file.read_text(encoding="utf-8"))) == [execution_id]
