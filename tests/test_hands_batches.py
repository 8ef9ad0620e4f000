"""Commands that travel together (a ``CommandBatch``, what a Brain sends when several intents of a
route committed at once) against a real Hands pool: each is handled as if it had come alone,
a bad one is parked alone, the message is settled once, a kill anywhere inside runs nothing
twice, and what a worker has no free slot for goes to another worker."""

from __future__ import annotations

import secrets
import signal
from typing import Any

import pytest

from infra.transport import REASON_HEADER
from protocol import command_batch_bytes, encode
from tests import hands_test_tools as lab
from tests.hands_bus import WAIT, Bus, command, runs, start_worker, start_worker_behind
from tests.hands_pg_proxy import CommitCutter
from tests.support import Processes, TendonEnv, wait_for

TERMINAL = {"succeeded", "failed", "cancelled", "unknown"}


async def ended(bus: Bus, execution_id: str) -> Any:
    """The event that ended ``execution_id`` (waits for it)."""

    async def found() -> Any:
        return next((e for e in bus.events(execution_id) if e.kind in TERMINAL), None)

    return await wait_for(found, timeout=WAIT, what=f"the end of {execution_id}")


async def nothing_left_in(bus: Bus, processes: Processes, worker: Any) -> None:
    """Stop ``worker`` (a message it never acked goes back to the queue) and check the queue."""
    worker.send_signal(signal.SIGTERM)
    assert await processes.wait_exit(worker) == 0
    assert await bus.broker.waiting(bus.topology.commands("lab")) == 0


async def _between_two_good_ones(bus: Bus, bad: Any) -> Any:
    """Publish ``bad`` in a batch between two good commands; both of those succeed, and what is
    parked is one message, returned."""
    good, other = command(lab.echo, {"text": "ok"}), command(lab.charge, {"amount": 1})
    await bus.publish_batch([good, bad, other])
    for cmd in (good, other):
        assert (await ended(bus, cmd.execution_id)).kind == "succeeded"
    (parked,) = await bus.parked(bus.topology.commands("lab"))
    return parked


async def test_each_command_of_a_batch_runs_once_and_the_message_is_settled_once(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    worker = await start_worker(processes, world)
    cmds = [
        command(lab.charge, {"amount": 5}),
        command(lab.echo, {"text": "a"}),
        command(lab.echo, {"text": "b"}),
    ]

    await bus.publish_batch(list(cmds))

    for cmd in cmds:
        assert (await ended(bus, cmd.execution_id)).kind == "succeeded"
    assert sorted(e for _, e, _ in runs(world)) == sorted(c.execution_id for c in cmds)
    await nothing_left_in(bus, processes, worker)


async def test_a_bad_command_in_a_batch_is_parked_alone_and_the_others_run(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    worker = await start_worker(processes, world)
    bad = command(lab.echo, {"text": "x"})
    tampered = bad.model_copy(update={"request_digest": "f" * 64})  # not the digest of its command

    parked = await _between_two_good_ones(bus, tampered)
    assert parked["execution_id"] == bad.execution_id and parked["message_id"] == bad.message_id
    assert "request_digest" in parked["reason"] and parked["kind"] == "execute"
    assert bus.events(bad.execution_id) == []
    await nothing_left_in(bus, processes, worker)


async def test_a_command_that_fails_for_good_goes_back_alone_and_meets_the_delivery_limit_by_itself(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a command the ledger cannot take (an execution id too long for its index: PostgreSQL
    # refuses the insert every time, not a passing fault) between two good ones
    worker = await start_worker(processes, world)
    bad = command(lab.echo, {"text": "x"}, execution_id=secrets.token_hex(3000))  # incompressible

    # Then the good ones run, and what is parked, once its tries ran out, is that command alone
    parked = await _between_two_good_ones(bus, bad)
    assert (parked["kind"], parked["message_id"]) == ("execute", bad.message_id)
    assert bus.events(bad.execution_id) == []
    await nothing_left_in(bus, processes, worker)


async def test_a_parked_batch_sends_its_commands_not_yet_in_the_ledger_back_alone(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a batch of which one command ran, parked as a whole (as after a worker died on it at
    # every delivery until the delivery limit)
    await start_worker(processes, world)
    done = command(lab.echo, {"text": "ran"})
    await bus.publish_command(done)
    await ended(bus, done.execution_id)
    waiting = [command(lab.charge, {"amount": 4}), command(lab.echo, {"text": "never ran"})]
    queue = bus.topology.commands("lab")
    body = command_batch_bytes([encode(c) for c in [done, *waiting]], "parked-batch")
    await bus.broker.publish(
        bus.topology.dlq(queue), body, message_id="parked-batch", headers={REASON_HEADER: "delivery limit"}
    )

    # Then the pool records it, sends the two that never ran back alone, and they run, once
    (parked,) = await bus.parked(queue)
    assert (parked["kind"], parked["surfaced"]) == ("commands", "2 of its 3 commands sent again alone")
    for cmd in waiting:
        assert (await ended(bus, cmd.execution_id)).kind == "succeeded"
    assert sorted(e for _, e, _ in runs(world)) == sorted(c.execution_id for c in [done, *waiting])


@pytest.mark.chaos
@pytest.mark.parametrize("point", ["hands.after_accept_commit", "hands.before_batch_ack"])
async def test_a_worker_killed_inside_a_batch_leaves_nothing_lost_and_nothing_run_twice(
    world: TendonEnv, bus: Bus, processes: Processes, point: str
) -> None:
    # Given a batch of unsafe charges, and a worker that dies after accepting the second one (or
    # once every command was handled, before the message's ack)
    cmds = [command(lab.charge, {"amount": n}) for n in (1, 2, 3)]
    tag = cmds[1 if point == "hands.after_accept_commit" else 0].body.call_id
    doomed = await start_worker(processes, world, TENDON_KILL_AT=f"{point}@{tag}")
    await bus.publish_batch(list(cmds))
    assert await processes.wait_exit(doomed, timeout=WAIT) == -9

    # When another worker gets the batch again
    worker = await start_worker(processes, world)

    # Then every charge ends, none was charged twice, and the message is settled
    for cmd in cmds:
        assert (await ended(bus, cmd.execution_id)).kind in ("succeeded", "unknown")
    ran = [e for _, e, _ in runs(world)]
    assert all(ran.count(c.execution_id) <= 1 for c in cmds), ran
    await nothing_left_in(bus, processes, worker)


async def test_what_a_worker_has_no_free_slot_for_goes_to_another_worker(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given two workers that each run one execution at a time
    workers = [await start_worker(processes, world, TENDON_CONCURRENCY="1") for _ in range(2)]
    cmds = [command(lab.slow, {"pages": 1, "delay": 1.0}) for _ in range(4)]

    # When four slow commands arrive in one message
    await bus.publish_batch(list(cmds))

    # Then both workers run some: the one that took the batch kept only what it could start
    ends = [await ended(bus, cmd.execution_id) for cmd in cmds]
    assert all(e.kind == "succeeded" for e in ends)
    started = {bus.by_seq(c.execution_id)[1].body.worker for c in cmds}
    assert len(started) == 2
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
        assert await processes.wait_exit(worker) == 0
    assert await bus.broker.waiting(bus.topology.commands("lab")) == 0


async def test_a_batch_whose_accept_commit_looked_failed_is_waited_out_and_each_command_runs_once(
    proxy: CommitCutter, world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a worker whose ledger connection loses the answer to its next COMMIT (the accepts of
    # the batch's commands, which share it), with a recovery scan too slow to help
    worker = await start_worker_behind(proxy, processes, world)
    proxy.arm(cut=1)
    cmds = [command(lab.charge, {"amount": n}) for n in (1, 2, 3)]

    # When the batch arrives: its accepts commit, but the worker sees the connection lost
    await bus.publish_batch(list(cmds))

    # Then each command, tried again, finds its own accepted row and starts it, once
    for cmd in cmds:
        events = await bus.wait_seqs(cmd.execution_id, 3)
        assert [events[s].kind for s in (1, 2, 3)] == ["accepted", "started", "succeeded"]
        assert (events[2].body.attempt, events[2].body.reason) == (1, "first_run")
    assert proxy.cuts == 1
    assert sorted(e for _, e, _ in runs(world)) == sorted(c.execution_id for c in cmds)

    # (Stopped here, while the proxy it talks through still runs in this event loop.)
    await nothing_left_in(bus, processes, worker)
