"""The Hands pool as real OS processes on real PostgreSQL, RabbitMQ and S3 (no mocks).

Commands are published straight onto ``<prefix>.lab.commands``; what the pool says comes
back on ``<prefix>.updates``. Chaos tests arm a kill point in one worker (SIGKILL at an exact
step) and let a second worker recover by the replay rule. Fault tests end a live worker's
liveness session, lose the answer to its COMMIT (``tests.hands_pg_proxy``), or feed a control
that makes PostgreSQL raise.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from infra.db import lock_class
from infra.objects.payloads import PayloadCodec
from infra.objects.s3 import S3ObjectStore
from infra.transport.broker import Broker, Topology
from protocol import (
    ExecuteCommand,
    ObjectRef,
    ReconcileBody,
    ReconcileControl,
    ReplayBody,
    ReplayControl,
    encode,
    new_id,
    request_digest,
)
from tests import hands_test_tools as lab
from tests.hands_bus import (
    SERVE,
    WAIT,
    Bus,
    cancel_of,
    command,
    ledger_fetch,
    replay_of,
    runs,
    start_worker,
    start_worker_behind,
)
from tests.hands_pg_proxy import CommitCutter
from tests.support import Observer, Processes, TendonEnv, wait_for

# ---- the happy path ---------------------------------------------------------------------


async def test_an_echo_command_is_accepted_started_and_succeeded_as_seq_1_to_3(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a Hands pool serving route lab
    await start_worker(processes, world)
    cmd = command(lab.echo, {"text": "hi"})

    # When an echo command arrives
    await bus.publish_command(cmd)

    # Then its events arrive as accepted, started, succeeded with seq 1..3 and its headers
    events = await bus.wait_seqs(cmd.execution_id, 3)
    assert [events[s].kind for s in (1, 2, 3)] == ["accepted", "started", "succeeded"]
    assert events[2].body.attempt == 1 and events[2].body.reason == "first_run"
    assert events[3].body.result == {"text": "hi", "attempt": 1}
    assert events[3].body.how == "ran"
    for e in events.values():
        assert (e.namespace, e.session_id) == (cmd.namespace, cmd.session_id)
        assert e.request_digest == cmd.request_digest
    assert runs(world) == [("echo", cmd.execution_id, 1)]


async def test_a_quick_tools_events_travel_as_one_message_and_a_slow_ones_start_is_not_held_for_its_end(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a pool whose events that end nothing may wait 0.3 s for their execution's outcome
    await start_worker(processes, world, TENDON_EVENT_LINGER="0.3")
    quick = command(lab.echo, {"text": "hi"})

    # When a quick tool runs, then its accepted, started and succeeded events come as one message
    await bus.publish_command(quick)
    await bus.wait_seqs(quick.execution_id, 3)
    assert bus.messages_of(quick.execution_id) == [[1, 2, 3]]

    # When a tool runs that ends after 4 s
    slow = command(lab.wait_cancel, {"seconds": 4.0})
    await bus.publish_command(slow)

    # Then its acceptance, start and first output page come after the linger, not at its end,
    # and its outcome in a message of its own
    await bus.wait_seqs(slow.execution_id, 3)
    assert [e.kind for e in bus.events(slow.execution_id)] == ["accepted", "started", "output_page"]
    await bus.wait_kind(slow.execution_id, "succeeded")
    assert bus.messages_of(slow.execution_id)[-1] == [4]
    assert sorted(s for m in bus.messages_of(slow.execution_id) for s in m) == [1, 2, 3, 4]


async def test_output_pages_are_committed_with_byte_offsets_before_the_terminal_event(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a pool and a tool that writes three output pages
    await start_worker(processes, world)
    cmd = command(lab.slow, {"pages": 3, "delay": 0.01})

    # When it runs
    await bus.publish_command(cmd)
    events = await bus.wait_seqs(cmd.execution_id, 6)

    # Then the pages come between started and succeeded with contiguous byte offsets,
    # and the terminal event carries the sealed output length
    kinds = [events[s].kind for s in range(1, 7)]
    assert kinds == [
        "accepted",
        "started",
        "output_page",
        "output_page",
        "output_page",
        "succeeded",
    ]
    pages = [events[s].body for s in (3, 4, 5)]
    assert [p.offset for p in pages] == [0, 7, 14]
    assert "".join(p.data for p in pages) == "page 0\npage 1\npage 2\n"
    assert events[6].body.output_bytes == 21
    chunks = await ledger_fetch(
        world,
        "SELECT byte_offset, data FROM output_chunks WHERE execution_id = $1 ORDER BY 1",
        cmd.execution_id,
    )
    assert [(c["byte_offset"], c["data"]) for c in chunks] == [
        (0, "page 0\n"),
        (7, "page 1\n"),
        (14, "page 2\n"),
    ]


async def test_the_same_command_delivered_twice_runs_once(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a pool that already ran a command
    worker = await start_worker(processes, world)
    cmd = command(lab.echo, {"text": "once"})
    await bus.publish_command(cmd)
    await bus.wait_seqs(cmd.execution_id, 3)

    # When the broker delivers the very same command again
    await bus.publish_command(cmd)

    # Then it is acknowledged as a duplicate and nothing runs again
    await wait_for(
        lambda: _async(lambda: "command_duplicate" in processes.output(worker)),
        timeout=WAIT,
        what="the duplicate to be acknowledged",
    )
    assert runs(world) == [("echo", cmd.execution_id, 1)]
    # and, for a sender that may have missed them, the same events are told once more
    await wait_for(
        lambda: _async(lambda: len(bus.events(cmd.execution_id)) >= 6),
        timeout=WAIT,
        what="the events to be published again",
    )
    events = bus.events(cmd.execution_id)
    assert sorted(e.seq for e in events) == [1, 1, 2, 2, 3, 3]
    assert len({e.message_id for e in events}) == 3  # the very same messages: the Brain drops them


async def _async(fn: Any) -> Any:
    return fn()


async def test_a_pool_with_concurrency_1_runs_one_execution_at_a_time(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a pool started with --concurrency 1
    await processes.start_ready("hands", [*SERVE, "--concurrency", "1"], world.env)
    first = command(lab.slow, {"pages": 2, "delay": 0.2})
    second = command(lab.slow, {"pages": 2, "delay": 0.2})

    # When two commands arrive together
    await bus.publish_command(first)
    await bus.publish_command(second)
    await bus.wait_kind(first.execution_id, "succeeded")
    await bus.wait_kind(second.execution_id, "succeeded")

    # Then one started only after the other had finished (their events were sent in that order)
    at = {
        (e.execution_id, e.kind): i for i, e in enumerate(bus.arrivals) if e.kind in ("started", "succeeded")
    }
    a, b = sorted((first.execution_id, second.execution_id), key=lambda e: at[(e, "started")])
    assert at[(b, "started")] > at[(a, "succeeded")]


async def test_a_pool_with_no_free_slot_acks_at_once_so_the_broker_sends_the_next_command(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a pool of one slot whose events that end nothing linger long (a held ack would wait
    # for them), running a tool that takes 10 s
    env = {**world.env, "TENDON_EVENT_LINGER": "30"}
    await processes.start_ready("hands", [*SERVE, "--concurrency", "1"], env)
    running = command(lab.wait_cancel, {"seconds": 10.0})
    queue = bus.topology.commands("lab")
    await bus.publish_command(running)

    async def accepted() -> bool:
        sql = "SELECT status FROM executions WHERE execution_id = $1"
        return bool(await ledger_fetch(world, sql, running.execution_id))

    await wait_for(accepted, timeout=WAIT, interval=0.02, what="the accept")

    # When a second command comes
    await bus.publish_command(command(lab.echo, {"text": "next"}))

    # Then the broker hands it over while the first tool runs (its prefetch of one was acked)
    async def handed_over() -> bool:
        return await bus.broker.waiting(queue) == 0

    await wait_for(handed_over, timeout=5.0, interval=0.05, what="the second command's delivery")


# ---- rejected commands ------------------------------------------------------------------


async def test_an_unknown_binding_digest_is_rejected_with_a_clear_failed_event_and_nothing_runs(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a pool serving echo under its current binding
    await start_worker(processes, world)
    stale = hashlib.sha256(b"echo, version 0").hexdigest()
    cmd = command(lab.echo, {"text": "hi"}, binding_digest=stale)

    # When a command names a binding digest the pool does not serve
    await bus.publish_command(cmd)

    # Then the only event is failed (how=rejected), seq 1, saying what was expected
    failed = await bus.wait_kind(cmd.execution_id, "failed")
    assert failed.seq == 1 and failed.body.how == "rejected"
    assert failed.body.error["code"] == "routing_error"
    message = failed.body.error["message"]
    assert stale[:8] in message and lab.echo.binding.digest[:8] in message
    assert "tool echo" in message and "route lab" in message
    assert runs(world) == []
    rows = await ledger_fetch(
        world, "SELECT status FROM executions WHERE execution_id = $1", cmd.execution_id
    )
    assert [r["status"] for r in rows] == ["failed"]


async def test_an_unknown_tool_or_invalid_arguments_are_rejected_and_nothing_runs(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a pool
    await start_worker(processes, world)
    unknown = command(lab.echo, {"text": "hi"})
    body = unknown.body.model_copy(update={"tool": "shout"})
    unknown = unknown.model_copy(
        update={"body": body, "request_digest": request_digest(unknown.execution_id, body)}
    )
    invalid = command(lab.echo, {"text": 3, "volume": "loud"})

    # When a command names a tool the route does not serve, and another has bad arguments
    await bus.publish_command(unknown)
    await bus.publish_command(invalid)

    # Then each fails (how=rejected) as its seq 1 with a message saying what was expected
    tool_error = (await bus.wait_kind(unknown.execution_id, "failed")).body.error
    assert tool_error["code"] == "routing_error"
    assert tool_error["message"].startswith("tool shout is not served by route lab (served: big")
    args_error = (await bus.wait_kind(invalid.execution_id, "failed")).body.error
    assert args_error["code"] == "schema_error"
    assert "arguments for tool 'echo' are invalid" in args_error["message"]
    assert "text" in args_error["message"] and "volume" in args_error["message"]
    assert runs(world) == []


async def test_the_same_execution_id_with_a_different_request_is_dead_lettered_as_a_conflict(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given an execution that ran
    await start_worker(processes, world)
    cmd = command(lab.echo, {"text": "first"})
    await bus.publish_command(cmd)
    await bus.wait_seqs(cmd.execution_id, 3)

    # When another command arrives with the same execution id but different arguments
    await bus.publish_command(command(lab.echo, {"text": "second"}, execution_id=cmd.execution_id))

    # Then it is parked as a conflict and nothing runs again
    queue = bus.topology.commands("lab")
    reason = (await bus.parked(queue))[0]["reason"]
    assert reason.startswith(f"conflict: execution {cmd.execution_id} is already in the ledger")
    assert runs(world) == [("echo", cmd.execution_id, 1)]


async def test_a_cancel_control_signals_the_running_tool_and_the_execution_ends_cancelled(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a tool that runs until it is cancelled
    await start_worker(processes, world)
    cmd = command(lab.wait_cancel, {})
    await bus.publish_command(cmd)
    await bus.wait_kind(cmd.execution_id, "output_page")

    # When the Brain sends a cancel
    await bus.publish_control(cancel_of(cmd, "user changed their mind"))

    # Then the tool sees ctx.cancelled and the execution ends CANCELLED as its seq 4
    cancelled = (await bus.wait_seqs(cmd.execution_id, 4))[4]
    assert cancelled.kind == "cancelled" and "cancel requested" in cancelled.body.reason
    rows = await ledger_fetch(
        world,
        "SELECT status, cancel_requested FROM executions WHERE execution_id = $1",
        cmd.execution_id,
    )
    assert [tuple(r) for r in rows] == [("cancelled", True)]


async def test_a_cancel_stops_the_running_tool_whichever_worker_of_a_pool_of_three_receives_it(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a pool of three workers (the route's control queue is shared: a cancel lands on any)
    await asyncio.gather(*(start_worker(processes, world) for _ in range(3)))

    for attempt in range(20):
        # ...a tool that runs until it is cancelled, running on one of them
        cmd = command(lab.wait_cancel, {"seconds": 60.0})
        await bus.publish_command(cmd)
        await bus.wait_kind(cmd.execution_id, "output_page")

        # When its cancel is sent, after 0-2 other controls (so that the broker's round robin
        # over the controls queue does not keep it in step with the one over the commands)
        for _ in range(attempt % 3):
            await bus.publish_control(replay_of(command(lab.echo, {"text": "not here"}), 1))
        await bus.publish_control(cancel_of(cmd, f"try {attempt}"))

        # Then the tool sees ctx.cancelled and the execution ends CANCELLED, every time, soon
        async def cancelled(execution_id: str = cmd.execution_id) -> bool:
            return any(e.kind == "cancelled" for e in bus.events(execution_id))

        await wait_for(cancelled, timeout=5.0, what=f"try {attempt}: the running tool cancelled")

    # ...and some of those cancels reached their tool through the ledger, from another worker
    assert await logged(processes, "cancel_passed_on")


async def test_a_cancel_that_comes_before_its_command_leaves_a_tombstone_and_the_command_never_runs(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a pool, and a command that has not reached it yet
    await start_worker(processes, world)
    cmd = command(lab.echo, {"text": "too late"})

    # When its cancel arrives first (the Brain settled the execution: its turn ended)
    await bus.publish_control(cancel_of(cmd, "its turn failed"))

    # Then the execution is CANCELLED at once, as its seq 1...
    tombstone = await bus.wait_kind(cmd.execution_id, "cancelled")
    assert tombstone.seq == 1 and "before its command arrived: its turn failed" in tombstone.body.reason

    # ...and when the command comes after all, it is a duplicate of that: it never runs
    await bus.publish_command(cmd)
    await bus.wait_seqs(cmd.execution_id, 1)
    rows = await ledger_fetch(
        world, "SELECT status FROM executions WHERE execution_id = $1", cmd.execution_id
    )
    assert [r["status"] for r in rows] == ["cancelled"]

    async def told_again() -> bool:
        return len([e for e in bus.events(cmd.execution_id) if e.kind == "cancelled"]) >= 2

    await wait_for(told_again, timeout=WAIT, what="the duplicate command answered with the tombstone")
    assert runs(world) == []


@pytest.mark.parametrize(
    "args",
    [{"text": "a\x00b"}, {"text": "a", "x\x00": 1}, {"text": "\x00", "extra": True}],
    ids=["in-a-value", "in-a-name", "in-an-invalid-call"],
)
async def test_a_command_whose_arguments_hold_a_nul_fails_as_rejected_instead_of_being_parked(
    world: TendonEnv, bus: Bus, processes: Processes, args: dict[str, Any]
) -> None:
    # Given a pool, and arguments that are valid JSON but that PostgreSQL cannot store
    await start_worker(processes, world)
    cmd = command(lab.echo, args)

    # When the command arrives
    await bus.publish_command(cmd)

    # Then the execution fails at once as rejected, saying why; nothing runs, nothing is parked
    failed = await bus.wait_kind(cmd.execution_id, "failed")
    assert (failed.seq, failed.body.how, failed.body.error["code"]) == (1, "rejected", "schema_error")
    assert "cannot be stored" in failed.body.error["message"] and "NUL" in failed.body.error["message"]
    assert runs(world) == []
    assert await ledger_fetch(world, "SELECT 1 FROM parked") == []


async def test_malformed_json_goes_to_the_commands_dead_letter_queue_with_a_reason(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a pool
    await start_worker(processes, world)

    # When a message with duplicate JSON keys arrives on the commands queue
    await bus.publish_command(b'{"kind": "execute", "kind": "execute"}')

    # Then it is parked in the commands DLQ with a reason header that says why
    queue = bus.topology.commands("lab")
    parked = await bus.parked(queue)
    assert len(parked) == 1 and parked[0]["surfaced"].startswith("logged")
    reason = parked[0]["reason"]
    assert reason.startswith("decode_error:") and "duplicate JSON key 'kind'" in reason


async def test_a_command_for_another_route_is_dead_lettered_with_a_reason_and_nothing_runs(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a pool of route lab
    await start_worker(processes, world)
    cmd = command(lab.echo, {"text": "hi"})
    body = cmd.body.model_copy(update={"route": "billing"})
    misrouted = cmd.model_copy(
        update={"body": body, "request_digest": request_digest(cmd.execution_id, body)}
    )

    # When a command addressed to route billing lands on lab's queue
    await bus.publish_command(misrouted)

    # Then it is parked with a reason naming both routes, nothing runs, and the sender hears
    # that the execution failed (rejected), saying why: parked messages are surfaced
    queue = bus.topology.commands("lab")
    (parked,) = await bus.parked(queue)
    assert "route billing" in parked["reason"] and "route lab" in parked["reason"]
    assert parked["surfaced"].startswith(f"execution {cmd.execution_id} failed as rejected")
    failed = await bus.wait_kind(cmd.execution_id, "failed")
    assert (failed.seq, failed.body.how, failed.body.error["code"]) == (1, "rejected", "parked")
    assert "route billing" in failed.body.error["message"]
    assert runs(world) == []


async def test_a_tool_that_raises_fails_with_its_exception_type_and_message(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a pool
    await start_worker(processes, world)
    cmd = command(lab.boom, {"message": "disk on fire"})

    # When the tool raises
    await bus.publish_command(cmd)

    # Then the execution fails (how=ran) with code tool_error and "<Type>: <message>"
    failed = (await bus.wait_seqs(cmd.execution_id, 3))[3]
    assert failed.kind == "failed" and failed.body.how == "ran"
    assert failed.body.error == {"code": "tool_error", "message": "ValueError: disk on fire"}


async def test_a_command_whose_body_ref_fails_verification_is_failed_for_the_turn_and_dead_lettered(
    world: TendonEnv, bus: Bus, processes: Processes, s3_server: Any
) -> None:
    # Given a pool, and a command whose body is "in S3" under a key that holds nothing
    await start_worker(processes, world)
    execution_id = new_id()
    scope = f"tests/s{execution_id[:8]}"
    sha = hashlib.sha256(b"never stored").hexdigest()
    cmd = ExecuteCommand(
        execution_id=execution_id,
        namespace="tests",
        session_id=f"s{execution_id[:8]}",
        request_digest=hashlib.sha256(b"command").hexdigest(),
        body_ref=ObjectRef(
            uri=f"s3://{s3_server.bucket}/{scope}/{execution_id}/execute/sha256/{sha}",
            sha256=sha,
            size=100,
            scope=scope,
            bound_to=f"{execution_id}/execute",
        ),
    )

    # When it arrives
    await bus.publish_command(cmd)

    # Then the turn hears a failed (rejected) event, and the message is parked with the reason
    failed = await bus.wait_kind(execution_id, "failed")
    assert failed.seq == 1 and failed.body.how == "rejected"
    assert failed.body.error["code"] == "object_ref_error"
    assert "missing" in failed.body.error["message"]
    queue = bus.topology.commands("lab")
    reason = (await bus.parked(queue))[0]["reason"]
    assert reason.startswith("object_ref_error:")
    assert runs(world) == []


async def test_sigterm_lets_a_running_tool_finish_and_publishes_its_outcome_before_exit(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a worker running a tool that takes about a second
    worker = await start_worker(processes, world)
    cmd = command(lab.slow, {"pages": 4, "delay": 0.25})
    await bus.publish_command(cmd)
    await bus.wait_kind(cmd.execution_id, "output_page")

    # When the worker is asked to stop
    worker.send_signal(signal.SIGTERM)

    # Then it drains: the tool finishes, its outcome is published, and the exit is clean
    assert await processes.wait_exit(worker, timeout=WAIT) == 0
    events = await bus.wait_seqs(cmd.execution_id, 7)
    assert events[7].kind == "succeeded" and events[7].body.result == {"pages": 4}
    assert runs(world) == [("slow", cmd.execution_id, 1)]


async def test_a_stopping_worker_acks_what_it_accepted_before_it_closes_the_commands_channel(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a worker whose events that end nothing linger long, so that the ack of a command it
    # accepted waits for their publish (``EventRelay.ack``), running that command's tool
    worker = await start_worker(processes, world, TENDON_EVENT_LINGER="30")
    cmd = command(lab.slow, {"pages": 4, "delay": 0.25})
    await bus.publish_command(cmd)

    async def running() -> bool:
        sql = "SELECT status FROM executions WHERE execution_id = $1"
        rows = await ledger_fetch(world, sql, cmd.execution_id)
        return bool(rows) and rows[0]["status"] == "running"

    await wait_for(running, timeout=WAIT, interval=0.02, what="the accept")

    # When it is asked to stop while the ack is held
    worker.send_signal(signal.SIGTERM)

    # Then it acks before it closes the channel: the command is not handed back to the queue
    assert await processes.wait_exit(worker, timeout=WAIT) == 0
    events = await bus.wait_seqs(cmd.execution_id, 7)
    assert events[7].kind == "succeeded"
    assert await bus.broker.waiting(bus.topology.commands("lab")) == 0


# ---- crashes ----------------------------------------------------------------------------


async def _crash_then_recover(
    world: TendonEnv, bus: Bus, processes: Processes, cmd: ExecuteCommand, point: str
) -> None:
    """Run ``cmd`` on a worker that SIGKILLs itself at ``point``, then start a healthy one."""
    doomed = await start_worker(processes, world, TENDON_KILL_AT=f"{point}@{cmd.body.call_id}")
    await bus.publish_command(cmd)
    assert await processes.wait_exit(doomed, timeout=WAIT) == -9
    await start_worker(processes, world)


@pytest.mark.chaos
async def test_a_worker_killed_after_accepting_but_before_acking_is_started_once_by_another(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a worker that dies after committing acceptance of unsafe tool charge, before acking
    cmd = command(lab.charge, {"amount": 3})

    # When a second worker gets the redelivery and notices the dead owner
    await _crash_then_recover(world, bus, processes, cmd, "hands.after_accept_commit")

    # Then the redelivery is a duplicate and the execution starts once, as its first run
    events = await bus.wait_seqs(cmd.execution_id, 3)
    assert [events[s].kind for s in (1, 2, 3)] == ["accepted", "started", "succeeded"]
    assert (events[2].body.attempt, events[2].body.reason) == (1, "first_run")
    assert events[2].body.worker != events[1].body.worker
    assert events[3].body.how == "ran"
    assert runs(world) == [("charge", cmd.execution_id, 1)]


@pytest.mark.chaos
async def test_a_safe_tool_killed_after_its_accept_and_start_commit_runs_once_by_another(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a worker that committed the acceptance and the start of safe tool echo together,
    # then died before acking the message (so before the body ran)
    cmd = command(lab.echo, {"text": "accepted"})

    # When a second worker gets the redelivery and notices the dead owner
    await _crash_then_recover(world, bus, processes, cmd, "hands.after_accept_commit")

    # Then the replay rule re-runs it as attempt 2, which is the body's only run; the first
    # worker's committed events reach the updates queue too (sent again by the new owner)
    events = await bus.wait_seqs(cmd.execution_id, 4)
    assert [events[s].kind for s in (1, 2, 3, 4)] == ["accepted", "started", "started", "succeeded"]
    assert (events[2].body.attempt, events[2].body.reason) == (1, "first_run")
    assert (events[3].body.attempt, events[3].body.reason) == (2, "rerun_after_crash")
    assert events[3].body.worker != events[1].body.worker
    assert runs(world) == [("echo", cmd.execution_id, 2)]


@pytest.mark.chaos
async def test_a_worker_killed_after_a_safe_tool_body_is_rerun_by_another_worker(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a worker that dies right after the body of safe tool echo returned
    cmd = command(lab.echo, {"text": "again"})

    # When a second worker notices the dead owner
    await _crash_then_recover(world, bus, processes, cmd, "hands.after_tool_body")

    # Then it runs the body again as attempt 2 and the execution succeeds
    events = await bus.wait_seqs(cmd.execution_id, 4)
    assert [events[s].kind for s in (1, 2, 3, 4)] == ["accepted", "started", "started", "succeeded"]
    assert (events[3].body.attempt, events[3].body.reason) == (2, "rerun_after_crash")
    assert events[4].body.result == {"text": "again", "attempt": 2}
    assert runs(world) == [("echo", cmd.execution_id, 1), ("echo", cmd.execution_id, 2)]


@pytest.mark.chaos
async def test_a_worker_killed_after_an_unsafe_tool_body_is_verified_by_its_query_not_rerun(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a worker that dies after unsafe tool charge reached the charges service
    cmd = command(lab.charge, {"amount": 42})

    # When a second worker takes over
    await _crash_then_recover(world, bus, processes, cmd, "hands.after_tool_body")

    # Then the query finds the original charge: succeeded how=verified_by_query, one run only
    events = await bus.wait_seqs(cmd.execution_id, 3)
    assert [events[s].kind for s in (1, 2, 3)] == ["accepted", "started", "succeeded"]
    assert events[3].body.how == "verified_by_query"
    assert events[3].body.result == {"charge_id": f"ch_{cmd.execution_id[:8]}", "amount": 42}
    assert runs(world) == [("charge", cmd.execution_id, 1)]


@pytest.mark.chaos
async def test_a_worker_killed_before_an_unsafe_body_ran_runs_it_once_the_query_says_not_found(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a worker that dies after committing RUNNING but before the body of charge began
    cmd = command(lab.charge, {"amount": 7})

    # When a second worker takes over
    await _crash_then_recover(world, bus, processes, cmd, "hands.before_tool_body")

    # Then the query says the service never saw the operation, so it runs now (attempt 2)
    events = await bus.wait_seqs(cmd.execution_id, 4)
    assert [events[s].kind for s in (1, 2, 3, 4)] == ["accepted", "started", "started", "succeeded"]
    assert events[3].body.reason == "rerun_after_crash" and events[4].body.how == "ran"
    assert runs(world) == [("charge", cmd.execution_id, 2)]


@pytest.mark.chaos
async def test_a_worker_killed_inside_an_unsafe_tool_without_query_stays_unknown_until_reconciled(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a worker that dies after the body of unsafe charge_noquery returned
    cmd = command(lab.charge_noquery, {"amount": 5})
    await _crash_then_recover(world, bus, processes, cmd, "hands.after_tool_body")

    # Then the second worker does not re-run it: the execution becomes UNKNOWN, saying why
    unknown = (await bus.wait_seqs(cmd.execution_id, 3))[3]
    assert unknown.kind == "unknown"
    assert "unsafe tool charge_noquery" in unknown.body.reason
    assert "no query" in unknown.body.reason
    assert runs(world) == [("charge_noquery", cmd.execution_id, 1)]

    # When an operator reconciles it with a result and evidence
    reconcile = [
        "-m",
        "hands",
        "reconcile",
        cmd.execution_id,
        "--result",
        '{"charged": 5}',
        "--evidence",
        "payment provider shows charge 5 at 10:02",
        "--actor",
        "alice",
    ]
    proc = processes.start("reconcile", reconcile, world.env)
    assert await processes.wait_exit(proc, timeout=WAIT) == 0, processes.output(proc)
    assert "UNKNOWN -> SUCCEEDED" in processes.output(proc)

    # Then succeeded (how=reconciled, with the evidence) is published and audited
    done = (await bus.wait_seqs(cmd.execution_id, 4))[4]
    assert done.kind == "succeeded" and done.body.how == "reconciled"
    assert done.body.result == {"charged": 5}
    assert done.body.evidence == "payment provider shows charge 5 at 10:02"
    audit = await ledger_fetch(
        world,
        "SELECT outcome, result, evidence, actor FROM reconciliations WHERE execution_id = $1",
        cmd.execution_id,
    )
    assert [dict(a) | {"result": json.loads(a["result"])} for a in audit] == [
        {
            "outcome": "succeeded",
            "result": {"charged": 5},
            "evidence": "payment provider shows charge 5 at 10:02",
            "actor": "alice",
        }
    ]

    # And reconciling it a second time is refused, naming its status
    again = processes.start("reconcile", [*reconcile[:4], "--failed", "no", "--evidence", "x"], world.env)
    assert await processes.wait_exit(again, timeout=WAIT) == 2
    assert "is SUCCEEDED, not UNKNOWN" in processes.output(again)
    assert runs(world) == [("charge_noquery", cmd.execution_id, 1)]

    # And `hands show` tells the whole story
    show = processes.start("show", ["-m", "hands", "show", cmd.execution_id, "--json"], world.env)
    assert await processes.wait_exit(show, timeout=WAIT) == 0
    story = json.loads(processes.output(show))
    assert story["execution"]["status"] == "succeeded"
    assert [e["kind"] for e in story["events"]] == ["accepted", "started", "unknown", "succeeded"]
    assert story["reconciliations"][0]["actor"] == "alice"


def reconcile_control(cmd: ExecuteCommand, request_id: str, **outcome: Any) -> ReconcileControl:
    """An operator's reconcile of ``cmd``'s execution, as a Brain sends it on the controls queue."""
    body = ReconcileBody(request_id=request_id, evidence="the provider's log", actor="ops", **outcome)
    header = {"namespace": cmd.namespace, "session_id": cmd.session_id, "request_digest": cmd.request_digest}
    return ReconcileControl(execution_id=cmd.execution_id, **header, body=body)


async def logged(processes: Processes, event: str) -> list[dict[str, Any]]:
    """The log lines of ``event`` every worker of the test wrote, once one did."""

    async def found() -> list[dict[str, Any]] | None:
        lines = []
        for proc in processes.children:
            text = await asyncio.to_thread(Path(proc.log_path).read_text, errors="replace")
            lines += [json.loads(x) for x in text.splitlines() if x.startswith("{") and f'"{event}"' in x]
        return [x for x in lines if x["event"] == event] or None

    return await wait_for(found, timeout=WAIT, what=f"a worker to log {event}")


@pytest.mark.chaos
async def test_a_reconcile_control_resolves_an_unknown_execution_once_and_a_repeated_or_late_one_is_acked(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given an execution left UNKNOWN by a worker killed inside unsafe charge_noquery
    cmd = command(lab.charge_noquery, {"amount": 5})
    await _crash_then_recover(world, bus, processes, cmd, "hands.after_tool_body")
    assert (await bus.wait_seqs(cmd.execution_id, 3))[3].kind == "unknown"

    # When a Brain sends an operator's reconcile on the route's control queue
    control = reconcile_control(cmd, "op-1", result={"charged": 5})
    await bus.publish_control(control)

    # Then the pool resolves it from its ledger: succeeded how=reconciled, audited with the
    # operator's request id, its event published and marked so
    done = (await bus.wait_seqs(cmd.execution_id, 4))[4]
    assert (done.kind, done.body.how, done.body.result) == ("succeeded", "reconciled", {"charged": 5})
    assert done.body.evidence == "the provider's log"

    async def audited() -> list[asyncpg.Record] | None:
        rows = await ledger_fetch(
            world, "SELECT request_id, actor, outcome, sent_at FROM reconciliations WHERE execution_id = $1",
            cmd.execution_id,
        )  # fmt: skip
        return rows if rows and rows[0]["sent_at"] is not None else None

    (audit,) = await wait_for(audited, timeout=WAIT, what="the reconcile's event marked sent")
    assert (audit["request_id"], audit["actor"], audit["outcome"]) == ("op-1", "ops", "succeeded")

    # When the same request comes again (a repeated request, a redelivery), and another request
    # reconciles the execution, which is not UNKNOWN any more
    await bus.publish_control(control)
    await bus.publish_control(reconcile_control(cmd, "op-2", failure="it bounced"))

    # Then both are acked: the first as a duplicate, the second with a warning naming the
    # status; nothing is written, published again, or dead-lettered, and nothing ran again
    (duplicate,) = await logged(processes, "reconcile_duplicate")
    assert (duplicate["request_id"], duplicate["execution_id"]) == ("op-1", cmd.execution_id)
    (refused,) = await logged(processes, "reconcile_refused")
    assert refused["level"] == "warning" and refused["request_id"] == "op-2"
    assert "is SUCCEEDED, not UNKNOWN" in refused["reason"]
    rows = await ledger_fetch(
        world, "SELECT request_id FROM reconciliations WHERE execution_id = $1", cmd.execution_id
    )
    assert [r["request_id"] for r in rows] == ["op-1"]
    assert await ledger_fetch(world, "SELECT * FROM parked") == []
    assert [e.seq for e in bus.events(cmd.execution_id) if e.seq >= 4] == [4]
    assert runs(world) == [("charge_noquery", cmd.execution_id, 1)]


# ---- replay and big payloads ------------------------------------------------------------


async def test_a_replay_control_republishes_events_from_seq_without_rerunning_the_tool(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given an execution whose three events were all delivered
    await start_worker(processes, world)
    cmd = command(lab.echo, {"text": "replay me"})
    await bus.publish_command(cmd)
    first = await bus.wait_seqs(cmd.execution_id, 3)

    # When the Brain asks for a replay from seq 2
    await bus.publish_control(replay_of(cmd, 2))

    # Then seq 2 and 3 arrive again, identical, seq 1 does not, and the tool did not run again
    async def replayed() -> bool:
        return len(bus.events(cmd.execution_id)) >= 5

    await wait_for(replayed, timeout=WAIT, what="the replayed events")
    seqs = sorted(e.seq for e in bus.events(cmd.execution_id))
    assert seqs == [1, 2, 2, 3, 3]
    again = bus.events(cmd.execution_id)[3:]
    assert {e.message_id for e in again} == {first[2].message_id, first[3].message_id}
    assert runs(world) == [("echo", cmd.execution_id, 1)]


async def test_a_replay_of_an_execution_the_pool_never_had_is_acked_with_a_reason_not_parked(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a pool that never had an execution (its command still waits elsewhere, or never came)
    worker = await start_worker(processes, world)
    cmd = command(lab.echo, {"text": "not here"})

    # When the Brain asks for a replay of it
    await bus.publish_control(replay_of(cmd, 1))

    # Then the pool says why there is nothing to send and acks it: it is no poison, so nothing
    # is parked (hands parked lists what is broken), and the pool goes on
    async def said() -> bool:
        log = await asyncio.to_thread(Path(worker.log_path).read_text, errors="replace")
        return "replay_of_an_execution_not_here" in log and cmd.execution_id in log

    await wait_for(said, timeout=WAIT, what="the pool to answer the replay")
    await bus.publish_command(cmd)
    await bus.wait_kind(cmd.execution_id, "succeeded")
    assert await ledger_fetch(world, "SELECT id FROM parked") == []


async def test_a_result_above_the_offload_threshold_arrives_as_a_body_ref_that_verifies(
    world: TendonEnv, bus: Bus, processes: Processes, s3_server: Any
) -> None:
    # Given a pool whose offload threshold is 4 KiB
    await start_worker(processes, world, TENDON_OFFLOAD_THRESHOLD="4096")
    cmd = command(lab.big, {"size": 20_000})

    # When a tool returns a 20 KB result
    await bus.publish_command(cmd)
    succeeded = await bus.wait_kind(cmd.execution_id, "succeeded")

    # Then the event carries a body_ref (no inline body) scoped to the session...
    ref = succeeded.body_ref
    assert succeeded.body is None and ref is not None
    assert ref.scope == f"{cmd.namespace}/{cmd.session_id}"

    # ...whose stored bytes match its sha256 and size...
    client = s3_server.client()
    try:
        key = ref.uri.removeprefix(f"s3://{s3_server.bucket}/")
        data = client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read()
    finally:
        client.close()
    assert (hashlib.sha256(data).hexdigest(), len(data)) == (ref.sha256, ref.size)

    # ...and that a receiver resolves to the full result
    async with S3ObjectStore(bucket=s3_server.bucket, endpoint_url=s3_server.endpoint_url) as store:
        resolved = await PayloadCodec(store, 4096).resolve(succeeded)
    assert resolved.body.result == {"blob": "x" * 20_000}
    assert json.loads(data)["result"] == {"blob": "x" * 20_000}


# ---- liveness ---------------------------------------------------------------------------


async def _the_worker(world: TendonEnv) -> asyncpg.Record:
    """The one registered worker of this test's ledger (id and liveness lock key)."""
    rows = await ledger_fetch(world, "SELECT id, lock_key FROM workers")
    assert len(rows) == 1, rows
    return rows[0]


async def test_a_worker_whose_liveness_session_ends_takes_it_again_and_finishes_its_body(
    world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a worker running a tool that takes a couple of seconds
    worker = await processes.start_ready("hands", SERVE, world.env)
    cmd = command(lab.slow, {"pages": 20, "delay": 0.1})
    await bus.publish_command(cmd)
    await bus.wait_kind(cmd.execution_id, "output_page")
    me = await _the_worker(world)

    # When its liveness session is terminated while the process lives on (a cut connection,
    # a restarted server)
    ended = await ledger_fetch(
        world,
        """SELECT pg_terminate_backend(l.pid) AS ended FROM pg_locks l
           WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1::oid
             AND l.objid = $2::oid AND l.objsubid = 2""",
        lock_class(world.settings().hands_schema),
        me["lock_key"],
    )
    assert [r["ended"] for r in ended] == [True]

    # Then it takes its liveness again and finishes the body itself: one run, its own outcome
    events = await bus.wait_seqs(cmd.execution_id, 2 + 20 + 1)
    assert events[23].kind == "succeeded"
    assert runs(world) == [("slow", cmd.execution_id, 1)]
    assert worker.poll() is None
    assert "liveness_restored" in processes.output(worker)
    rows = await ledger_fetch(world, "SELECT dead_at, lock_lost_at FROM workers WHERE id = $1", me["id"])
    assert [tuple(r) for r in rows] == [(None, None)]


# ---- an accept whose commit looked failed -----------------------------------------------


async def test_a_command_whose_accept_commit_looked_failed_but_landed_is_started_when_it_comes_back(
    proxy: CommitCutter, world: TendonEnv, bus: Bus, processes: Processes
) -> None:
    # Given a worker whose ledger connection will lose the answer to its next COMMIT, and
    # whose recovery scan is too slow to help (so the redelivery must start the execution)
    worker = await start_worker_behind(proxy, processes, world)
    proxy.arm(cut=1)
    cmd = command(lab.charge, {"amount": 9})  # unsafe: its accept leaves it ACCEPTED, not started

    # When a command arrives: its accept commits, but the worker sees the connection lost,
    # so it hands the message back and gets it again
    await bus.publish_command(cmd)

    # Then it finds its own ACCEPTED row, acks and starts it (once) instead of taking it for a
    # duplicate and leaving it accepted under a live owner
    events = await bus.wait_seqs(cmd.execution_id, 3)
    assert proxy.cuts == 1
    assert [events[s].kind for s in (1, 2, 3)] == ["accepted", "started", "succeeded"]
    assert events[2].body.worker == events[1].body.worker
    assert (events[2].body.attempt, events[2].body.reason) == (1, "first_run")
    assert runs(world) == [("charge", cmd.execution_id, 1)]

    # (Stopped here, while the proxy it talks through still runs in this event loop.)
    worker.send_signal(signal.SIGTERM)
    assert await processes.wait_exit(worker, timeout=WAIT) == 0


# ---- controls ---------------------------------------------------------------------------


async def test_a_control_that_raises_an_unforeseen_error_is_handed_back_until_it_is_dead_lettered(
    world: TendonEnv, processes: Processes
) -> None:
    # Given a worker whose queues park a message after 2 redeliveries
    world.extra["TENDON_DELIVERY_LIMIT"] = "2"
    worker = await start_worker(processes, world)
    settings = world.settings()
    topology = Topology(settings.queue_prefix)

    # When a replay control arrives that makes PostgreSQL raise (a NUL in its execution id)
    control = ReplayControl(
        execution_id="bad\x00id",
        namespace="tests",
        session_id="s1",
        request_digest="0" * 64,
        body=ReplayBody(from_seq=1),
    )
    async with Broker(settings.amqp_url, topology, delivery_limit=2) as broker:
        await broker.publish(topology.controls("lab"), encode(control), message_id=new_id())

    # Then it is never left unacked: it is handed back after a pause each time, the delivery
    # limit parks it, and the pool reads it back from the controls' dead-letter queue
    (parked,) = await Observer(world).parked(topology.controls("lab"), component="hands")
    assert bytes(parked["body"]) == encode(control)
    assert parked["reason"].startswith("delivered more times than the delivery limit allows")
    log = await asyncio.to_thread(Path(worker.log_path).read_text, errors="replace")
    assert log.count('"event": "handling_failed"') >= 2, log[-3000:]
