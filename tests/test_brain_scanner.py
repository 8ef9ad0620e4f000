"""The repair scan: its nudging rules as pure functions, and what it sends (or does not) against a
real transport, on both backends."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from brain.run.context import BrainContext
from brain.run.relay import CommandRelay, ControlRelay
from brain.run.scanner import Nudge, RepairScanner, next_look, nudge_for
from brain.store import BrainStore
from infra.db import dialect
from infra.objects.payloads import PayloadCodec
from infra.process.killpoints import KillPoints
from infra.transport import Delivery, Topology, Transport
from infra.transport.broker import Broker
from infra.transport.localqueue import LocalBroker
from protocol import decode
from tests import test_brain_store
from tests.support import TendonEnv, wait_for
from tests.test_brain_store import _apply, _cancel, _events, _submit, _waiting_on

store = test_brain_store.store  # the store fixture, on both backends

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _execution(**changes: Any) -> dict[str, Any]:
    row = {
        "status": "accepted",
        "now": NOW,
        "updated_at": NOW - timedelta(seconds=5),
        "replay_requested_at": None,
        "stall_backoff": 1,
        "nudges": 0,
        "creator_alive": True,
    }
    return {**row, **changes}


def test_a_command_whose_brain_died_before_its_publish_is_sent_again_at_once() -> None:
    fresh = _execution(status="intended", updated_at=NOW, creator_alive=False)
    assert nudge_for(fresh, stall=10, attempts=8, updates_line=True) is Nudge.RESEND
    # once sent again, it waits like any other
    assert nudge_for({**fresh, "nudges": 1}, stall=10, attempts=8, updates_line=False) is Nudge.NONE
    # its Brain alive: its publish is in flight, nothing is sent twice
    assert nudge_for({**fresh, "creator_alive": True}, stall=10, attempts=8, updates_line=False) is Nudge.NONE


def test_a_stalled_execution_is_nudged_ever_less_often_and_given_up_on_after_the_attempts() -> None:
    quiet = _execution(updated_at=NOW - timedelta(seconds=5))
    assert nudge_for(quiet, stall=1, attempts=8, updates_line=False) is Nudge.REPLAY
    assert nudge_for({**quiet, "status": "intended"}, stall=1, attempts=8, updates_line=False) is Nudge.RESEND
    # nudged 1.5 s ago with a backoff of 2: not yet; at 2.5 s: again
    nudged = {**quiet, "stall_backoff": 2, "nudges": 1}
    assert nudge_for({**nudged, "replay_requested_at": NOW - timedelta(seconds=1.5)}, stall=1, attempts=8,
                     updates_line=False) is Nudge.NONE  # fmt: skip
    assert nudge_for({**nudged, "replay_requested_at": NOW - timedelta(seconds=2.5)}, stall=1, attempts=8,
                     updates_line=False) is Nudge.REPLAY  # fmt: skip
    # while events wait for the Brains, nothing is a stall (the answer may be among them)
    assert nudge_for(quiet, stall=1, attempts=8, updates_line=True) is Nudge.NONE
    # after the attempts, the turn fails instead of asking forever
    assert nudge_for({**quiet, "nudges": 8}, stall=1, attempts=8, updates_line=False) is Nudge.GIVE_UP
    # and a waiting turn is looked at again when one of its executions may be due
    assert next_look(_execution(updated_at=NOW), stall=10, nudged=False) == 10
    assert next_look(nudged, stall=10, nudged=True) == 40
    assert next_look({**nudged, "stall_backoff": 64}, stall=10, nudged=True) == 640


class Scan:
    """A repair scanner of a test world, and what it sent."""

    def __init__(self, store: BrainStore, transport: Transport, prefix: str, **options: Any) -> None:
        self.sent: list[tuple[str, bytes, str]] = []
        ctx = BrainContext(
            store=store, codec=PayloadCodec(None, 1 << 20), topology=Topology(prefix),
            killpoints=KillPoints(), commands=CommandRelay(transport),
            controls=ControlRelay(store, transport, interval=1.0), owner="brain-scan", wake_channel="ch",
            lease_seconds=30.0, binding_wait_seconds=60.0, first_look=1.0,
        )  # fmt: skip

        async def publish(messages: list[tuple[str, bytes, str]]) -> None:
            self.sent += messages

        self.scanner = RepairScanner(
            ctx, gap_timeout=1.0, stall_seconds=1.0, interval=1.0, waiting=transport.waiting,
            consumers=transport.consumers, publish=publish, **options,
        )  # fmt: skip

    async def once(self) -> list[tuple[str, bytes, str]]:
        self.sent = []
        await self.scanner.scan_once()
        return self.sent


def _transport(store: BrainStore, tendon: TendonEnv, tmp_path: Path) -> Transport:
    if dialect(store.pool) == "postgres":
        return Broker(tendon.amqp_url, Topology(tendon.prefix))
    return LocalBroker(tmp_path / "queues.sqlite3", Topology(tendon.prefix))


async def _quiet(store: BrainStore, seconds: float = 600.0) -> None:
    """Make the world's waiting turns due for a look and their executions quiet for ``seconds``."""
    when = datetime.now(UTC) - timedelta(seconds=seconds)
    await store.pool.execute("UPDATE turns SET wake_at = $1 WHERE status = 'waiting'", when)
    await store.pool.execute("UPDATE executions SET updated_at = $1, replay_requested_at = $1", when)


async def test_a_stalled_command_is_not_sent_again_while_commands_wait_in_its_queue(
    store: BrainStore, tendon: TendonEnv, tmp_path: Path
) -> None:
    # Given a command that Hands have not acknowledged for 5 s (stall after 1 s), its Brain alive
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "e7")
    queue = Topology(tendon.prefix).commands("lab")
    tendon.routes.add("lab")  # its queues are deleted at teardown
    await store.pool.execute(
        "INSERT INTO workers (id, kind, lock_key, lease_expires_at)"
        " VALUES ('brain-test', 'brain', 0, ts_add(now(), 600))"
    )
    await store.pool.execute("UPDATE executions SET created_by = 'brain-test'")
    async with _transport(store, tendon, tmp_path) as transport:
        scan = Scan(store, transport, tendon.prefix)
        # and a busy pool: its one consumer works on a command, another waits in line
        held: list[Delivery] = []

        async def hold(delivery: Delivery) -> None:
            held.append(delivery)

        busy = await transport.consume(queue, hold, prefetch=1)
        await transport.publish(queue, b"worked on", message_id="m-busy")
        await transport.publish(queue, b"ahead", message_id="m-ahead")

        async def one_held_one_waiting() -> bool:
            return bool(held) and await transport.waiting(queue) == 1

        await wait_for(one_held_one_waiting, timeout=10, what="a busy pool")

        # When the scan passes, it sends nothing again: the command is most likely in that line
        await _quiet(store, 5)
        assert await scan.once() == []
        await _quiet(store, 5)
        assert await scan.once() == []  # also once it knows the route is busy
        assert await store.pool.fetchval("SELECT stall_backoff FROM executions WHERE id = 'e7'") == 1

        async def take_all(name: str) -> None:
            taken: list[Delivery] = []

            async def take(delivery: Delivery) -> None:
                taken.append(delivery)
                await delivery.ack()

            consumer = await transport.consume(name, take, prefetch=1)
            deadline = asyncio.get_running_loop().time() + 10
            while await transport.waiting(name) or not taken:
                assert asyncio.get_running_loop().time() < deadline, f"nothing was taken from {name}"
                await asyncio.sleep(0.02)
            await consumer.close()

        # When the command line is gone (the pool served it, and waits for more) but events wait
        # for the Brains (its answer may be there)
        await busy.close()
        await take_all(queue)
        idle = await transport.consume(queue, hold, prefetch=1)
        updates = Topology(tendon.prefix).updates
        await transport.publish(updates, b"an event", message_id="m-event")
        await _quiet(store, 5)
        assert await scan.once() == []

        # Then once no line is left, the command is sent again from its row (it may have been lost)
        await take_all(updates)
        await _quiet(store, 5)
        assert await scan.once() == [(queue, b"{}", "m-e7")]
        assert await store.pool.fetchval("SELECT stall_backoff FROM executions WHERE id = 'e7'") == 2
        await idle.close()


async def test_a_command_nobody_serves_is_not_sent_again_and_its_turn_fails_after_the_attempts(
    store: BrainStore, tendon: TendonEnv, tmp_path: Path
) -> None:
    # Given an execution whose command went to a route that no pool consumes
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "e8", route="gone")
    tendon.routes.add("gone")
    async with _transport(store, tendon, tmp_path) as transport:
        scan = Scan(store, transport, tendon.prefix, repair_attempts=3)
        # (its Brain died before it published: sent again once, to nobody; that counts too)
        await _quiet(store)
        assert await scan.once() == []
        for attempt in range(2, 4):
            await _quiet(store)
            # When the scan passes: nothing is sent again (nobody would take it), but it counts
            assert await scan.once() == []
            assert await store.pool.fetchval("SELECT nudges FROM executions WHERE id = 'e8'") == attempt
        await _quiet(store)
        # Then, the attempts used up, the turn fails with an error naming the silent route, and its
        # execution is settled: cancelled here, and its Hands told (a cancel control in the outbox)
        await scan.once()
    turn = await store.pool.fetchrow("SELECT status, error FROM turns WHERE id = $1", turn_id)
    assert turn["status"] == "failed" and turn["error"]["code"] == "no_answer"
    assert "route gone" in turn["error"]["message"] and "e8" in turn["error"]["message"]
    row = await store.pool.fetchrow("SELECT status, error FROM executions WHERE id = 'e8'")
    assert row["status"] == "cancelled" and "turn ended first" in row["error"]["message"]
    (cancel,) = await store.read(store.outbox.unpublished_controls)
    assert cancel.queue == Topology(tendon.prefix).controls("gone")
    assert decode(cancel.payload).kind == "cancel"
    entries = await store.read(lambda c: store.journal.entries(c, "ns/s1"))
    kinds = [f["kind"] for f in entries[-1].facts]  # the step closed with its outcome, as it failed
    assert kinds == ["turn.results_applied", "turn.failed", "execution.cancelled"]


def test_the_command_of_a_turn_being_cancelled_is_never_sent_again_its_hands_are_asked_instead() -> None:
    orphan = _execution(status="intended", creator_alive=False, cancelling=True)
    assert nudge_for(orphan, stall=10, attempts=8, updates_line=False) is Nudge.NONE
    quiet = {**orphan, "updated_at": NOW - timedelta(seconds=20)}
    assert nudge_for(quiet, stall=10, attempts=8, updates_line=False) is Nudge.REPLAY
    assert nudge_for({**quiet, "nudges": 8}, stall=10, attempts=8, updates_line=False) is Nudge.GIVE_UP


async def test_a_replay_nobody_would_take_is_not_sent_and_a_cancelled_turn_is_not_sent_its_cancel_again(
    store: BrainStore, tendon: TendonEnv, tmp_path: Path
) -> None:
    # Given a cancelled turn that waits for an execution a Hands worker accepted before its route's
    # pool went away (its cancel was published already)
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "e9", route="gone")
    tendon.routes.add("gone")
    await _apply(store, [_events("e9")[0]])
    assert (await _cancel(store, turn_id, [])).status == "received"
    await store.pool.execute("UPDATE outbox SET published_at = now()")
    async with _transport(store, tendon, tmp_path) as transport:
        scan = Scan(store, transport, tendon.prefix, repair_attempts=2)
        for attempt in (1, 2):
            await _quiet(store)
            # When the scan passes: no replay request is sent (it would pile up for a pool that
            # comes later, asking about work it never had), but the silence counts
            assert await scan.once() == []
            assert await store.pool.fetchval("SELECT nudges FROM executions WHERE id = 'e9'") == attempt
        await _quiet(store)
        await scan.once()
    # Then, the attempts used up, the turn fails naming the route, and its execution is settled
    # without a second cancel: the cancel of the turn told its Hands already
    turn = await store.pool.fetchrow("SELECT status, error FROM turns WHERE id = $1", turn_id)
    assert turn["status"] == "failed" and "route gone" in turn["error"]["message"]
    assert await store.pool.fetchval("SELECT status FROM executions WHERE id = 'e9'") == "cancelled"
    assert await store.read(store.outbox.unpublished_controls) == []
