"""Updates from Hands to the Brain: gaps, duplicates, reordering, S3 references, bad input."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from examples.mailbox import MailboxServer
from protocol import EventBatch, ObjectRef, decode, encode
from tests.support import Observer, Processes, TendonEnv, run_cli, wait_for

BRAIN = ["-m", "brain", "serve"]
HANDS_EMAIL = ["-m", "hands", "serve", "--route", "email", "--tools", "examples.email_tools"]
HANDS_BULK = ["-m", "hands", "serve", "--route", "bulk", "--tools", "tests.brain_e2e_tools"]

pytestmark = pytest.mark.chaos


@pytest.fixture
def mailbox() -> Iterator[MailboxServer]:
    with MailboxServer(port=0) as server:
        yield server


async def _drain(amqp_url: str, queue: str) -> list[bytes]:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        q = await channel.get_queue(queue)
        bodies = []
        while (message := await q.get(no_ack=False, fail=False)) is not None:
            bodies.append(message.body)
            await message.ack()
        return bodies


async def _publish(amqp_url: str, queue: str, bodies: list[bytes]) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        for body in bodies:
            await channel.default_exchange.publish(
                aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=queue,
            )


async def test_duplicate_reordered_and_missing_updates_are_applied_once_and_the_gap_replayed(
    tendon: TendonEnv, processes: Processes, mailbox: MailboxServer
) -> None:
    env = {**tendon.env, "TENDON_MAILBOX_URL": mailbox.url}
    updates = f"t-{tendon.suffix}.updates"
    obs = Observer(tendon)
    await processes.start_ready("hands", HANDS_EMAIL, env)
    # Given a Brain that dies on the first update, so Hands' events for call-1 pile up
    doomed = await processes.start_ready(
        "brain", BRAIN, {**env, "TENDON_KILL_AT": "brain.after_update_received@accepted"}
    )
    code, turn_id, err = await run_cli(
        [
            "-m",
            "brain",
            "submit",
            "--session",
            "s-gap",
            "--request-id",
            "r",
            "--agent",
            "examples/notice_agent.json",
            "notice",
        ],
        env,
    )
    assert code == 0, err
    turn_id = turn_id.strip()
    assert await processes.wait_exit(doomed) == -signal.SIGKILL

    # Hands' events for call-1 pile up in the updates queue (in batches of event ranges)
    by_seq: dict[int, Any] = {}

    async def all_published() -> bool:
        for body in await _drain(tendon.amqp_url, updates):
            by_seq.update({e.seq: e for e in decode(body).events})
        return any(e.kind == "succeeded" for e in by_seq.values())

    await wait_for(all_published, timeout=30, what="Hands to publish call-1's events")
    last = max(by_seq)
    assert sorted(by_seq) == list(range(1, last + 1)) and last >= 3
    # The command reached Hands (it ran). The next Brain would send it again when it looks at the
    # turn (the Brain that committed it is dead), Hands would send all events again, and the gap
    # would close without the replay this test is about: that look comes later here.
    await obs.fetch("UPDATE {brain}.turns SET wake_at = now() + interval '60 seconds' WHERE id = $1", turn_id)

    # When the broker delivers the last event first, then the first one twice, and loses the rest
    one = [encode(EventBatch(events=[by_seq[s]])) for s in (last, 1, 1)]
    await _publish(tendon.amqp_url, updates, one)
    brain = await processes.start_ready("brain", BRAIN, env)

    # Then the turn completes: the gap was replayed from Hands' ledger, the tool ran once
    await obs.wait_turn(turn_id, "completed")
    first = (await obs.executions(turn_id))[0]
    assert first["last_seq"] == last and first["status"] == "succeeded"
    asked = [
        json.loads(line) for line in processes.output(brain).splitlines() if '"replay_requested"' in line
    ]
    assert [(a["execution_id"], a["from_seq"], a["reason"]) for a in asked] == [(first["id"], 2, "gap")]
    ledger = {r["execution_id"]: r for r in await obs.ledger()}
    assert ledger[first["id"]]["attempts"] == 1
    assert sorted(mailbox.stats()["posts_per_key"].values()) == [1, 1, 1, 1, 1]


def _bulk_agent(tmp_path: Path, blob: str) -> str:
    agent = {
        "name": "bulk",
        "version": "1",
        "tools": ["echo_blob"],
        "model": {
            "kind": "scripted",
            "script": [
                {"tool_calls": [{"tool": "echo_blob", "args": {"blob": blob}}]},
                {"content": "echoed"},
            ],
        },
    }
    path = tmp_path / "bulk_agent.json"
    path.write_text(json.dumps(agent))
    return str(path)


async def _run_bulk_turn(
    tendon: TendonEnv, processes: Processes, tmp_path: Path, blob: str, **brain_env: str
) -> str:
    """A Brain and a "bulk" Hands pool with a 4 KiB offload threshold; submit one echo turn."""
    tendon.routes.add("bulk")
    env = {**tendon.env, "TENDON_OFFLOAD_THRESHOLD": "4096"}
    await processes.start_ready("brain", BRAIN, {**env, **brain_env})
    await processes.start_ready("hands", HANDS_BULK, env)
    agent = _bulk_agent(tmp_path, blob)
    code, out, err = await run_cli(
        [
            "-m",
            "brain",
            "submit",
            "--session",
            f"s-{tendon.suffix}",
            "--request-id",
            "r",
            "--agent",
            agent,
            "echo",
        ],
        env,
    )
    assert code == 0, err
    return out.strip()


def _bucket_keys(s3_server, prefix: str) -> list[str]:  # type: ignore[no-untyped-def]
    listing = s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix=prefix)
    return [o["Key"] for o in listing.get("Contents", [])]


async def test_arguments_and_results_over_the_threshold_travel_through_s3(
    tendon: TendonEnv,
    processes: Processes,
    s3_server,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    blob = "x" * 20_000
    turn_id = await _run_bulk_turn(tendon, processes, tmp_path, blob)
    obs = Observer(tendon)
    await obs.wait_turn(turn_id, "completed")
    (row,) = await obs.executions(turn_id)
    assert row["result"] == {"blob": blob, "length": 20_000}
    # One object for the command's body and one for the result's, in the session's scope, each
    # under the message it was written for
    keys = _bucket_keys(s3_server, f"default/s-{tendon.suffix}/{row['id']}/")
    assert sorted(k.split("/")[3] for k in keys) == ["execute", "succeeded-3"]


async def test_a_tampered_result_object_is_refused_and_fails_the_turn_with_a_clear_error(
    tendon: TendonEnv,
    processes: Processes,
    s3_server,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    blob = "y" * 20_000
    obs = Observer(tendon)
    # Given a Brain that dies as the result's update arrives, before it reads the result...
    turn_id = await _run_bulk_turn(
        tendon, processes, tmp_path, blob, TENDON_KILL_AT="brain.after_update_received@succeeded"
    )
    assert await processes.wait_exit(processes.children[0]) == -signal.SIGKILL
    # ...and the result's object then holding other bytes of the same size
    (row,) = await obs.executions(turn_id)
    (event,) = [e for e in await obs.hands_events(row["id"]) if e["kind"] == "succeeded"]
    ref = ObjectRef.model_validate(event["body_ref"])
    key = ref.uri.removeprefix(f"s3://{s3_server.bucket}/")
    body = s3_server.client().get_object(Bucket=s3_server.bucket, Key=key)["Body"].read()
    s3_server.client().put_object(Bucket=s3_server.bucket, Key=key, Body=body.replace(b"y", b"z", 1))

    # When a Brain receives the update again
    await processes.start_ready("brain", BRAIN, {**tendon.env, "TENDON_OFFLOAD_THRESHOLD": "4096"})
    turn = await obs.wait_turn(turn_id, "failed")
    assert turn["error"]["code"] == "object_ref_error"
    assert "sha256 mismatch" in turn["error"]["message"]
    (parked,) = await obs.parked(f"t-{tendon.suffix}.updates")
    assert parked["kind"] == "events" and parked["execution_id"] == row["id"]
    assert "sha256 mismatch" in parked["reason"]
    assert parked["surfaced"] == "logged: nothing was left to tell"  # the turn had failed already


async def test_malformed_and_foreign_updates_are_dead_lettered_with_a_reason_and_nothing_changes(
    tendon: TendonEnv, processes: Processes, mailbox: MailboxServer
) -> None:
    env = {**tendon.env, "TENDON_MAILBOX_URL": mailbox.url}
    updates = f"t-{tendon.suffix}.updates"
    await processes.start_ready("brain", BRAIN, env)
    good = {
        "v": 1,
        "kind": "accepted",
        "message_id": "m",
        "execution_id": "exe-nope",
        "namespace": "default",
        "session_id": "s",
        "request_digest": "a" * 64,
        "seq": 1,
        "body": {"worker": "w"},
        "body_ref": None,
    }
    bad = [
        b'{"v": 1, "kind": "accepted"',  # malformed JSON
        b'{"v": 1, "v": 1}',  # duplicate keys
        json.dumps({**good, "seq": "one"}).encode(),  # wrong schema
        encode(decode(json.dumps(good).encode())),  # unknown execution
    ]
    await _publish(tendon.amqp_url, updates, bad)

    obs = Observer(tendon)
    # (read back concurrently: in any order)
    parked = {bytes(r["body"]): r for r in await obs.parked(updates, count=4)}
    assert "malformed JSON" in parked[bad[0]]["reason"]
    assert "duplicate JSON key 'v'" in parked[bad[1]]["reason"]
    assert "seq" in parked[bad[2]]["reason"]
    assert "unknown execution exe-nope" in parked[bad[3]]["reason"]
    assert all(r["surfaced"].startswith("logged") for r in parked.values())
    assert await obs.fetch("SELECT * FROM {brain}.executions") == []


async def test_a_turn_whose_tool_no_hands_pool_serves_waits_as_a_row_then_fails_with_a_clear_error(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    env = {**tendon.env, "TENDON_BINDING_WAIT_SECONDS": "3"}
    brain = await processes.start_ready("brain", BRAIN, env)
    turn_id = await _submit_bulk(env, tmp_path)
    obs = Observer(tendon)

    # While no pool serves it, the turn waits as a row, saying what for: one run, not one per scan
    waiting = await obs.wait_turn(turn_id, "waiting")
    assert waiting["waiting_for"] == "a Hands pool to announce echo_blob"
    turn = await obs.wait_turn(turn_id, "failed", timeout=20)

    # Then, at the deadline, it fails with a routing error; the deadline woke it once more
    assert turn["error"]["code"] == "routing_error"
    assert "no Hands pool announced tool(s) echo_blob within 3s" in turn["error"]["message"]
    runs = await obs.facts(turn_id, "turn.run_started")
    assert [r["phase"] for r in runs] == ["prepare", "prepare"]
    assert processes.output(brain).count('"event": "run_started"') == 2


async def test_a_turn_waiting_for_its_tools_is_woken_when_a_pool_announces_them(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    # Given a turn that waits for a pool (it would wait for a minute)
    tendon.routes.add("bulk")
    await processes.start_ready("brain", BRAIN, tendon.env)
    turn_id = await _submit_bulk(tendon.env, tmp_path)
    obs = Observer(tendon)
    await obs.wait_turn(turn_id, "waiting")

    # When the pool starts and announces its tools, Then the turn goes on at once
    await processes.start_ready("hands", HANDS_BULK, tendon.env)
    await obs.wait_turn(turn_id, "completed", timeout=20)


async def _submit_bulk(env: dict[str, str], tmp_path: Path) -> str:
    """Submit a turn of the bulk agent (its tool echo_blob: route bulk); returns its id."""
    code, out, err = await run_cli(
        [
            "-m",
            "brain",
            "submit",
            "--session",
            "s",
            "--request-id",
            "r",
            "--agent",
            _bulk_agent(tmp_path, "b"),
            "--expect-tools",  # the tests wait for a pool that starts later, or never
            "go",
        ],
        env,
    )
    assert code == 0, err
    return out.strip()
