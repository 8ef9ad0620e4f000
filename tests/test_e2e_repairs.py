"""Lost messages are repaired by the Brain's periodic scan; a broken turn never stops a Brain."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest

from brain.rules.retry import RetryPolicy
from examples.mailbox import MailboxServer
from protocol import decode
from tests.support import Observer, Processes, TendonEnv, run_cli, wait_for

BRAIN = ["-m", "brain", "serve"]
HANDS = ["-m", "hands", "serve", "--route", "email", "--tools", "examples.email_tools"]

pytestmark = pytest.mark.chaos


@pytest.fixture
def mailbox() -> Iterator[MailboxServer]:
    with MailboxServer(port=0) as server:
        yield server


async def _submit(env: dict[str, str], agent: str = "examples/notice_agent.json") -> str:
    # One session per agent: a session's thread keeps the agent version it started with.
    session = Path(agent).stem
    code, out, err = await run_cli(
        ["-m", "brain", "submit", "--session", session, "--request-id", "r", "--agent", agent, "go"], env
    )
    assert code == 0, err
    return out.strip()


async def _take_all(amqp_url: str, queue: str) -> list[bytes]:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        q = await (await connection.channel()).get_queue(queue)
        taken = []
        while (message := await q.get(no_ack=False, fail=False)) is not None:
            taken.append(message.body)
            await message.ack()
        return taken


async def _waiting(amqp_url: str, queue: str) -> bool:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        q = await (await connection.channel()).declare_queue(queue, passive=True)
        return bool(q.declaration_result.message_count)


async def test_a_command_lost_by_the_broker_is_sent_again_after_it_stalls(
    tendon: TendonEnv, processes: Processes, mailbox: MailboxServer
) -> None:
    env = {**tendon.env, "TENDON_MAILBOX_URL": mailbox.url, "TENDON_STALL_SECONDS": "1"}
    obs = Observer(tendon)
    await processes.start_ready("brain", BRAIN, env)
    # A Hands pool announces its tools, then goes away
    announcer = await processes.start_ready("hands", HANDS, env)

    async def announced() -> bool:
        return bool(await obs.fetch("SELECT 1 FROM {brain}.bindings WHERE name = 'send_email'"))

    await wait_for(announced, what="send_email to be announced")
    announcer.send_signal(signal.SIGTERM)
    assert await processes.wait_exit(announcer) == 0
    turn_id = await _submit(env)

    queue = f"t-{tendon.suffix}.email.commands"

    async def first_command_published() -> bool:
        return bool(await obs.fetch("SELECT 1 FROM {brain}.executions")) and await _waiting(
            tendon.amqp_url, queue
        )

    await wait_for(first_command_published, what="the first command to be published")
    # Given the broker lost the command before any Hands saw it
    lost = await _take_all(tendon.amqp_url, queue)
    assert [decode(b).kind for b in lost] == ["execute"]

    # When a Hands pool comes up, the stalled execution's command is published again
    await processes.start_ready("hands", HANDS, env)
    await obs.wait_turn(turn_id, "completed")
    assert sorted(mailbox.stats()["posts_per_key"].values()) == [1, 1, 1, 1, 1]


async def test_a_command_its_dead_brain_committed_but_never_published_is_sent_at_once_by_another(
    tendon: TendonEnv, processes: Processes, mailbox: MailboxServer
) -> None:
    # Given two Brains, and stalls that would take far longer than the test waits
    env = {**tendon.env, "TENDON_MAILBOX_URL": mailbox.url, "TENDON_STALL_SECONDS": "300"}
    obs = Observer(tendon)
    await processes.start_ready("hands", HANDS, env)
    doomed = await processes.start_ready(
        "brain", BRAIN, {**env, "TENDON_KILL_AT": "brain.after_intent_commit@call-2"}
    )
    turn_id = await _submit(env)
    assert await processes.wait_exit(doomed) == -signal.SIGKILL  # the second command never left
    await processes.start_ready("brain", BRAIN, env)

    # Then the standby hears of the death and sends the command now, not after the stall
    await obs.wait_turn(turn_id, "completed", timeout=60)
    assert sorted(mailbox.stats()["posts_per_key"].values()) == [1, 1, 1, 1, 1]


async def test_a_lost_final_event_is_asked_for_again_and_applied(
    tendon: TendonEnv, processes: Processes, mailbox: MailboxServer
) -> None:
    env = {**tendon.env, "TENDON_MAILBOX_URL": mailbox.url, "TENDON_STALL_SECONDS": "1"}
    obs = Observer(tendon)
    await processes.start_ready("hands", HANDS, env)
    doomed = await processes.start_ready(
        "brain", BRAIN, {**env, "TENDON_KILL_AT": "brain.after_update_received@succeeded"}
    )
    turn_id = await _submit(env)
    assert await processes.wait_exit(doomed) == -signal.SIGKILL

    # Given the broker lost call-1's final event (the Brain applied the ones before it)
    taken = [decode(b) for b in await _take_all(tendon.amqp_url, f"t-{tendon.suffix}.updates")]
    assert "succeeded" in [e.kind for batch in taken for e in batch.events]

    # When a Brain runs again, it notices no progress and asks Hands to replay the tail
    await processes.start_ready("brain", BRAIN, env)
    await obs.wait_turn(turn_id, "completed")
    ledger = await obs.ledger()
    assert all(r["attempts"] == 1 for r in ledger) and len(ledger) == 5
    assert sorted(mailbox.stats()["posts_per_key"].values()) == [1, 1, 1, 1, 1]


async def test_a_turn_that_crashes_its_run_fails_clearly_and_the_brain_keeps_serving(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text(
        json.dumps(
            {
                "name": "broken",
                "version": "1",
                "model": {"kind": "scripted", "script": [{"tool_calls": [{}]}]},
            }
        )
    )
    fine = tmp_path / "fine.json"
    fine.write_text(
        json.dumps(
            {"name": "fine", "version": "1", "model": {"kind": "scripted", "script": [{"content": "ok"}]}}
        )
    )
    env = {**tendon.env, "TENDON_CONCURRENCY": "1"}
    await processes.start_ready("brain", BRAIN, env)
    obs = Observer(tendon)
    failed = await obs.wait_turn(await _submit(env, str(broken)), "failed")
    assert failed["error"] == {"code": "internal_error", "message": "KeyError: 'tool'"}
    done = await obs.wait_turn(await _submit(env, str(fine)), "completed")
    assert done["result"] == {"text": "ok"}


def test_retry_backoff_grows_exponentially_up_to_its_cap():
    policy = RetryPolicy(initial=0.5, multiplier=2, maximum=4, max_retries=3)
    assert [policy.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert not policy.exhausted(3) and policy.exhausted(4)
