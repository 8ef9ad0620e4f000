"""The five-email story with the Brain and Hands as real OS processes on real services.

Kill points (TENDON_KILL_AT) make a process SIGKILL itself at an exact step, so each crash
lands in the same place every run; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from brain.rules.states import TurnPhase, phase_path_exists
from examples.mailbox import MailboxServer
from tests.support import Observer, Processes, TendonEnv, run_cli, wait_for

BRAIN = ["-m", "brain", "serve"]
HANDS = ["-m", "hands", "serve", "--route", "email", "--tools", "examples.email_tools"]
AGENT = "examples/notice_agent.json"
CUSTOMERS = {f"customer{i}@example.com" for i in range(1, 6)}

pytestmark = pytest.mark.chaos


@pytest.fixture
def mailbox() -> Iterator[MailboxServer]:
    with MailboxServer(port=0) as server:
        yield server


@pytest.fixture
def blind_mailbox() -> Iterator[MailboxServer]:
    """A mail service that cannot be asked what happened to an operation."""
    with MailboxServer(port=0, lookup=False) as server:
        yield server


async def submit(env: dict[str, str], request_id: str = "notice-1") -> str:
    code, out, err = await run_cli(
        [
            "-m",
            "brain",
            "submit",
            "--session",
            "s-notice",
            "--request-id",
            request_id,
            "--agent",
            AGENT,
            "Send the maintenance notice to our five customers",
        ],
        env,
    )
    assert code == 0, err
    return out.strip()


def assert_five_deliveries_one_per_customer(mailbox: MailboxServer) -> None:
    stats = mailbox.stats()
    assert sorted(d["to"] for d in stats["deliveries"]) == sorted(CUSTOMERS)
    # Every operation id was posted exactly once: nothing was ever re-sent blindly.
    assert sorted(stats["posts_per_key"].values()) == [1, 1, 1, 1, 1]


async def assert_five_receipts(obs: Observer, turn_id: str) -> list:  # type: ignore[type-arg]
    rows = await obs.executions(turn_id)
    assert [r["call_id"] for r in rows] == [f"call-{i}" for i in range(1, 6)]
    assert all(r["status"] == "succeeded" for r in rows)
    assert len({r["id"] for r in rows}) == 5
    ledger = await obs.ledger()
    assert sorted(r["execution_id"] for r in ledger) == sorted(r["id"] for r in rows)
    turn = await obs.turn(turn_id)
    for r in rows:
        assert r["result"]["message_id"] in turn["result"]["text"]
    assert await obs.orphans() == {}  # the database checks no foreign keys: the code keeps them
    return rows


async def test_the_five_email_turn_completes_across_brain_and_two_hands_processes(
    tendon: TendonEnv, processes: Processes, mailbox: MailboxServer
) -> None:
    env = {**tendon.env, "TENDON_MAILBOX_URL": mailbox.url}
    await processes.start_ready("brain", BRAIN, env)
    await processes.start_ready("hands", HANDS, env)
    await processes.start_ready("hands", HANDS, env)

    turn_id = await submit(env)
    assert await submit(env) == turn_id  # accepted means durable: same request, same turn

    obs = Observer(tendon)
    await obs.wait_turn(turn_id, "completed")
    rows = await assert_five_receipts(obs, turn_id)
    assert {r["how"] for r in rows} == {"ran"}
    assert_five_deliveries_one_per_customer(mailbox)

    code, out, _ = await run_cli(["-m", "brain", "show", turn_id, "--json"], env)
    shown = json.loads(out)
    assert code == 0 and shown["status"] == "completed"
    assert "Receipts" in shown["result"]["text"]

    # The journal has an entry per commit of the turn, each saying where the commit left it (the
    # steps, each one a move the tables allow), and the facts of that commit: six replies, five
    # intents, their five outcomes and the five times results went to the model, one ending.
    entries = await obs.fetch(
        "SELECT status, phase, facts FROM {brain}.journal WHERE turn_id = $1 ORDER BY seq", turn_id
    )
    phases = [TurnPhase(e["phase"]) for e in entries]
    assert all(phase_path_exists(a, b) for a, b in zip(phases, phases[1:], strict=False)), phases
    kinds = Counter(f["kind"] for e in entries for f in e["facts"])
    replied, intended = kinds["turn.model_replied"], kinds["execution.intended"]
    assert (replied, intended, kinds["execution.succeeded"]) == (6, 5, 5)
    assert (kinds["turn.results_applied"], kinds["turn.completed"], kinds["turn.accepted"]) == (5, 1, 1)
    assert (entries[-1]["status"], entries[-1]["phase"]) == ("completed", "done")


async def test_a_hands_worker_killed_after_the_mailbox_accepted_email_four_is_verified_not_resent(
    tendon: TendonEnv, processes: Processes, mailbox: MailboxServer
) -> None:
    # Given two Hands workers, either of which dies right after the 4th send returns
    env = {**tendon.env, "TENDON_MAILBOX_URL": mailbox.url}
    armed = {**env, "TENDON_KILL_AT": "hands.after_tool_body@call-4"}
    await processes.start_ready("brain", BRAIN, env)
    workers = [await processes.start_ready("hands", HANDS, armed) for _ in range(2)]

    # When the turn runs
    turn_id = await submit(env)
    obs = Observer(tendon)
    await obs.wait_turn(turn_id, "completed")

    # Then exactly one worker was SIGKILLed, and the 4th email was verified by its operation id
    assert sorted(w.poll() for w in workers if w.poll() is not None) == [-signal.SIGKILL]
    rows = await assert_five_receipts(obs, turn_id)
    assert [r["how"] for r in rows] == ["ran", "ran", "ran", "verified_by_query", "ran"]
    assert_five_deliveries_one_per_customer(mailbox)


async def test_a_hands_worker_killed_between_an_outcome_commit_and_its_publish_is_repaired_from_the_ledger(
    tendon: TendonEnv, processes: Processes, mailbox: MailboxServer
) -> None:
    # Given a Hands worker that dies once it committed an outcome, before its relay published it
    # (the execution is closed in the ledger: no other worker takes it over), and a Brain that
    # asks for silent executions' events after a second
    env = {**tendon.env, "TENDON_MAILBOX_URL": mailbox.url, "TENDON_STALL_SECONDS": "1"}
    await processes.start_ready("brain", BRAIN, env)
    doomed = await processes.start_ready(
        "hands", HANDS, {**env, "TENDON_KILL_AT": "hands.before_event_publish@succeeded"}
    )
    turn_id = await submit(env)
    assert await processes.wait_exit(doomed) == -signal.SIGKILL

    # When another worker serves the route
    await processes.start_ready("hands", HANDS, env)

    # Then the Brain's replay request is answered from the committed row: the first email is
    # reported as sent once, and nothing ran twice
    obs = Observer(tendon)
    await obs.wait_turn(turn_id, "completed")
    rows = await assert_five_receipts(obs, turn_id)
    assert {r["how"] for r in rows} == {"ran"}
    assert_five_deliveries_one_per_customer(mailbox)


async def test_with_a_mailbox_that_cannot_be_queried_email_four_stays_unknown_until_reconciled(
    tendon: TendonEnv, processes: Processes, blind_mailbox: MailboxServer
) -> None:
    env = {**tendon.env, "TENDON_MAILBOX_URL": blind_mailbox.url}
    await processes.start_ready("brain", BRAIN, env)
    doomed = await processes.start_ready(
        "hands", HANDS, {**env, "TENDON_KILL_AT": "hands.after_tool_body@call-4"}
    )

    turn_id = await submit(env)
    await processes.wait_exit(doomed)
    survivor = await processes.start_ready("hands", HANDS, env)

    # The 4th execution becomes UNKNOWN and the turn waits: nothing is guessed.
    obs = Observer(tendon)

    async def unknown_execution():  # type: ignore[no-untyped-def]
        rows = [r for r in await obs.executions(turn_id) if r["status"] == "unknown"]
        return rows[0] if rows else None

    fourth = await wait_for(unknown_execution, timeout=30, what="execution 4 to be UNKNOWN")
    assert fourth["call_id"] == "call-4"
    turn = await obs.turn(turn_id)
    assert turn["status"] == "waiting" and "reconcile" in turn["waiting_for"]
    assert len(blind_mailbox.stats()["deliveries"]) == 4
    # Whoever waits for the turn is told what it waits for, and how to give it that
    code, _, err = await run_cli(["-m", "brain", "wait", turn_id, "--timeout", "1"], env)
    assert code == 3
    told = err.splitlines()[0]
    assert told.startswith(f"brain: turn {turn_id} waits for reconcile of") and fourth["id"] in told
    assert "hands reconcile EXECUTION_ID --result JSON --evidence TEXT" in told
    # and the pool's log says so as a warning, naming the command, from a process it names
    log = await asyncio.to_thread(Path(survivor.log_path).read_text)  # type: ignore[attr-defined]
    lines = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
    (said,) = [x for x in lines if x["event"] == "execution_unknown"]
    assert said["level"] == "warning"
    assert said["resolve"].startswith(f"hands reconcile {fourth['id']} --result")
    assert said["process"] == "hands" and said["worker"].startswith("hands-")

    # An operator reconciles it with the mailbox's own record as evidence.
    receipt = next(d for d in blind_mailbox.stats()["deliveries"] if d["idempotency_key"] == fourth["id"])
    code, out, err = await run_cli(
        [
            "-m",
            "hands",
            "reconcile",
            fourth["id"],
            "--result",
            json.dumps(receipt),
            "--evidence",
            f"mailbox delivery log lists {receipt['message_id']} for this key",
        ],
        env,
    )
    assert code == 0, err

    await obs.wait_turn(turn_id, "completed")
    rows = await assert_five_receipts(obs, turn_id)
    assert rows[3]["how"] == "reconciled" and "delivery log" in rows[3]["evidence"]
    audit = await obs.fetch("SELECT * FROM {hands}.reconciliations")
    assert len(audit) == 1 and audit[0]["execution_id"] == fourth["id"]
    assert_five_deliveries_one_per_customer(blind_mailbox)


@pytest.mark.parametrize(
    "kill_at",
    [
        "brain.after_intent_commit@call-2",
        "brain.after_update_received@succeeded",
        "brain.after_apply_commit@succeeded",
    ],
    ids=[
        "after-intent-commit-before-publish",
        "after-update-received-before-commit",
        "after-apply-and-claim-commit-before-ack",
    ],
)
async def test_a_brain_killed_mid_turn_is_resumed_by_a_restarted_brain_without_duplicates(
    tendon: TendonEnv, processes: Processes, mailbox: MailboxServer, kill_at: str
) -> None:
    env = {**tendon.env, "TENDON_MAILBOX_URL": mailbox.url}
    await processes.start_ready("hands", HANDS, env)
    doomed = await processes.start_ready("brain", BRAIN, {**env, "TENDON_KILL_AT": kill_at})
    turn_id = await submit(env)
    assert await processes.wait_exit(doomed) == -signal.SIGKILL

    await processes.start_ready("brain", BRAIN, env)
    obs = Observer(tendon)
    await obs.wait_turn(turn_id, "completed")
    await assert_five_receipts(obs, turn_id)
    assert_five_deliveries_one_per_customer(mailbox)
    runs = await obs.fetch("SELECT runs FROM {brain}.turns WHERE id = $1", turn_id)
    assert runs[0]["runs"] >= 2
