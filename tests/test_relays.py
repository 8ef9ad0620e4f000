"""The relays: how the Hands group committed events into messages (pure rules), and that the
Hands event relay and the Brain command relay publish what they are handed at once, pausing only
after the broker refused something; events that end nothing may linger for an outcome to take
them along."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from brain.run.relay import BATCH_COMMANDS, CommandRelay, bundled
from hands.run.relay import MAX_EVENTS, EventRelay, linger_left, messages, ranges
from infra.transport import Topology
from protocol import (
    CommandBatch,
    EventBatch,
    ExecuteBody,
    ExecuteCommand,
    batch_bytes,
    decode,
    encode,
    request_digest,
)
from tests.support import wait_for

_BODIES: dict[str, dict[str, Any]] = {
    "accepted": {"worker": "w"},
    "started": {"attempt": 1, "worker": "w", "reason": "first_run"},
    "succeeded": {"result": 1},
}


def _event(execution_id: str, seq: int, kind: str = "started") -> dict[str, Any]:
    return {
        "v": 1,
        "message_id": f"m-{execution_id}-{seq}",
        "kind": kind,
        "execution_id": execution_id,
        "namespace": "ns",
        "session_id": "s",
        "request_digest": "0" * 64,
        "seq": seq,
        "body": _BODIES[kind],
    }


def _seqs(batch: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(e["execution_id"], e["seq"]) for e in batch]


def test_events_are_grouped_per_execution_into_contiguous_runs_without_duplicates() -> None:
    handed = [_event("a", 2), _event("b", 1), _event("a", 1), _event("a", 2), _event("a", 4)]
    assert [_seqs(r) for r in ranges(handed)] == [[("a", 1), ("a", 2)], [("a", 4)], [("b", 1)]]


def test_a_message_carries_several_executions_ranges_and_a_long_range_is_split_in_order() -> None:
    handed = [_event("a", s) for s in range(1, MAX_EVENTS + 3)] + [_event("b", 1)]
    out = messages(handed, max_bytes=1 << 30)
    assert [len(m) for m in out] == [MAX_EVENTS, 3]
    assert [s for m in out for s in _seqs(m)] == [("a", s) for s in range(1, MAX_EVENTS + 3)] + [("b", 1)]
    for m in out:  # each is a valid batch: contiguous ranges, one header per execution
        assert isinstance(decode(batch_bytes(m)), EventBatch)


def test_two_ranges_of_one_execution_never_share_a_message() -> None:
    # A takeover sends the row's events (output pages left out) and then its new start: a gap.
    handed = [_event("a", 1), _event("a", 2), _event("b", 1), _event("a", 10), _event("a", 11)]
    out = messages(handed, max_bytes=1 << 30)
    assert [_seqs(m) for m in out] == [[("a", 1), ("a", 2)], [("a", 10), ("a", 11), ("b", 1)]]
    for m in out:
        assert isinstance(decode(batch_bytes(m)), EventBatch)


def test_a_message_stays_under_its_byte_budget_unless_one_event_alone_is_bigger() -> None:
    handed = [_event("a", s) for s in range(1, 6)]
    one = len(str(handed[0]))
    assert all(len(m) <= 2 for m in messages(handed, max_bytes=2 * one))
    assert [len(m) for m in messages(handed, max_bytes=1)] == [1] * 5


class _GatedTransport:
    """Publishes into a list once ``gate`` is open; refuses the first ``refuse`` messages."""

    def __init__(self) -> None:
        self.topology = Topology("relay-test")
        self.gate = asyncio.Event()
        self.published: list[list[tuple[str, int]]] = []
        self.refuse = 0  # refuse this many publishes (then accept)

    async def publish_many(self, items: list[tuple[str, bytes, str]]) -> list[BaseException | None]:
        await self.gate.wait()
        out: list[BaseException | None] = []
        for _, body, _ in items:
            if self.refuse:
                self.refuse -= 1
                out.append(ConnectionError("broker away"))
                continue
            if body.startswith(b"command"):
                self.published.append([("command", int(body[7:]))])
            elif isinstance(envelope := decode(body), (CommandBatch, ExecuteCommand)):
                commands = envelope.commands if isinstance(envelope, CommandBatch) else [envelope]
                self.published.append([("command", int(c.execution_id[1:])) for c in commands])
            else:
                batch = decode(body)
                self.published.append([(e.execution_id, e.seq) for e in batch.events])
            out.append(None)
        return out


async def test_events_handed_over_while_a_publish_is_in_flight_go_out_at_once_not_after_the_interval() -> (
    None
):
    # Given a relay with a long interval whose first publish is in flight
    transport = _GatedTransport()
    relay = EventRelay(None, transport, route="r", interval=60.0)  # type: ignore[arg-type]
    loop = asyncio.create_task(relay.run())
    try:
        relay.send([_event("a", 1)])
        await asyncio.sleep(0.05)
        # When more events are handed over meanwhile, and the publish then completes
        relay.send([_event("a", 2), _event("a", 3)])
        transport.gate.set()

        # Then they are published right after, long before the interval
        async def both() -> bool:
            return sum(len(m) for m in transport.published) == 3

        await wait_for(both, timeout=5, interval=0.01, what="both")
        assert transport.published == [[("a", 1)], [("a", 2), ("a", 3)]]
    finally:
        loop.cancel()


async def test_an_outcome_that_takes_lingering_events_along_leaves_no_wake_up_behind() -> None:
    # Given a relay whose events that end nothing linger a while
    transport = _GatedTransport()
    transport.gate.set()
    relay = EventRelay(None, transport, route="r", interval=60.0, linger=0.3)  # type: ignore[arg-type]
    loop = asyncio.create_task(relay.run())
    try:
        await asyncio.sleep(0.05)
        # When an execution's accept lingers and its outcome comes before the linger ends
        relay.send([_event("a", 1, "accepted"), _event("a", 2, "started")])
        await asyncio.sleep(0.05)
        relay.send([_event("a", 3, "succeeded")])

        async def sent() -> bool:
            return transport.published == [[("a", 1), ("a", 2), ("a", 3)]]

        await wait_for(sent, timeout=5, interval=0.01, what="sent")
        # Then the relay woke once, for the outcome: not again when the linger would have ended
        await asyncio.sleep(0.5)
        assert relay.rounds == 1
    finally:
        loop.cancel()


@pytest.mark.parametrize("linger", [0.0, 60.0])
async def test_events_the_broker_refused_are_published_again_after_a_pause(linger: float) -> None:
    transport = _GatedTransport()
    transport.gate.set()
    transport.refuse = 1
    relay = EventRelay(None, transport, route="r", interval=0.2, linger=linger)  # type: ignore[arg-type]
    loop = asyncio.create_task(relay.run())
    try:
        relay.send([_event("a", 1, "succeeded")])

        async def sent() -> bool:
            return transport.published == [[("a", 1)]]

        await wait_for(sent, timeout=5, interval=0.01, what="sent")
        assert relay.events == 1 and relay.messages == 1
    finally:
        loop.cancel()


@pytest.mark.parametrize(
    ("ending", "waited", "linger", "left"),
    [
        (True, 0.0, 0.02, 0.0),  # an outcome goes at once, and takes the rest along
        (False, 0.0, 0.02, 0.02),  # accepted, started, output: may wait for company
        (False, 0.015, 0.02, 0.005),
        (False, 0.5, 0.02, 0.0),  # waited long enough: a slow tool's start is not held longer
        (False, 0.0, 0.0, 0.0),  # no linger: at once
    ],
)
def test_what_ends_nothing_lingers_at_most_the_linger(
    ending: bool, waited: float, linger: float, left: float
) -> None:
    assert linger_left(ending, waited, linger) == pytest.approx(left)


async def test_a_quick_outcome_takes_its_accepted_and_started_events_along_in_one_message() -> None:
    transport = _GatedTransport()
    transport.gate.set()
    relay = EventRelay(None, transport, route="r", interval=60.0, linger=30.0)  # type: ignore[arg-type]
    loop = asyncio.create_task(relay.run())
    try:
        relay.send([_event("a", 1, "accepted"), _event("a", 2, "started")])
        relay.send([_event("b", 1, "accepted")])
        await asyncio.sleep(0.1)
        assert transport.published == []  # held for company, not published alone
        relay.send([_event("a", 3, "succeeded")])

        async def sent() -> bool:
            return bool(transport.published)

        await wait_for(sent, timeout=5, interval=0.01, what="the outcome")
        # One message: a's whole range, and b's accept that was waiting too.
        assert transport.published == [[("a", 1), ("a", 2), ("a", 3), ("b", 1)]]
    finally:
        loop.cancel()


async def test_events_that_end_nothing_go_out_alone_once_they_lingered() -> None:
    transport = _GatedTransport()
    transport.gate.set()
    relay = EventRelay(None, transport, route="r", interval=60.0, linger=0.3)  # type: ignore[arg-type]
    loop = asyncio.create_task(relay.run())
    try:
        start = time.monotonic()
        relay.send([_event("a", 1, "accepted")])
        relay.send([_event("a", 2, "started")])  # the linger counts from the oldest pending one

        async def sent() -> bool:
            return bool(transport.published)

        await wait_for(sent, timeout=5, interval=0.005, what="the lingering events")
        assert time.monotonic() - start >= 0.3  # not before the linger (and not after the interval)
        assert transport.published == [[("a", 1), ("a", 2)]]
    finally:
        loop.cancel()


class _Delivery:
    """A command's delivery that notes when it was acked, in the transport's record."""

    def __init__(self, record: list[Any], name: str) -> None:
        self.record, self.name = record, name

    async def ack(self) -> None:
        self.record.append(("ack", self.name))


class _RecordingTransport(_GatedTransport):
    """Also notes each publish in ``record``, in order with the acks."""

    def __init__(self) -> None:
        super().__init__()
        self.record: list[Any] = []

    async def publish_many(self, items: list[tuple[str, bytes, str]]) -> list[BaseException | None]:
        results = await super().publish_many(items)
        self.record.append(("publish", self.published[-1] if self.published else []))
        return results


async def test_a_commands_ack_goes_after_the_publish_of_the_events_pending_at_its_accept() -> None:
    # Given a relay whose events that end nothing linger, and an accept's events pending
    transport = _RecordingTransport()
    transport.gate.set()
    relay = EventRelay(None, transport, route="r", interval=60.0, linger=30.0)  # type: ignore[arg-type]
    loop = asyncio.create_task(relay.run())
    try:
        relay.send([_event("a", 1, "accepted"), _event("a", 2, "started")])
        # When the command's delivery is acked while the tool runs
        await relay.ack(_Delivery(transport.record, "a"))  # type: ignore[arg-type]
        await asyncio.sleep(0.1)
        # Then it is held (nothing is written beside the running tool)
        assert transport.record == []
        # And once the outcome is handed over, the ack follows its publish
        relay.send([_event("a", 3, "succeeded")])

        async def acked() -> bool:
            return ("ack", "a") in transport.record

        await wait_for(acked, timeout=5, interval=0.01, what="the ack")
        assert transport.record == [("publish", [("a", 1), ("a", 2), ("a", 3)]), ("ack", "a")]
    finally:
        loop.cancel()


async def test_a_commands_ack_waits_at_most_the_linger_and_goes_at_once_when_nothing_is_pending() -> None:
    transport = _RecordingTransport()
    transport.gate.set()
    relay = EventRelay(None, transport, route="r", interval=60.0, linger=0.3)  # type: ignore[arg-type]
    loop = asyncio.create_task(relay.run())
    try:
        # A slow tool: its accept's events go out once they lingered, and the ack with them
        start = time.monotonic()
        relay.send([_event("a", 1, "accepted"), _event("a", 2, "started")])
        await relay.ack(_Delivery(transport.record, "a"))  # type: ignore[arg-type]

        async def acked() -> bool:
            return ("ack", "a") in transport.record

        await wait_for(acked, timeout=5, interval=0.005, what="the ack")
        assert 0.3 <= time.monotonic() - start < 5
        assert transport.record == [("publish", [("a", 1), ("a", 2)]), ("ack", "a")]
        # Nothing pending (a duplicate whose events went out already): acked at once
        await relay.ack(_Delivery(transport.record, "b"))  # type: ignore[arg-type]
        assert transport.record[-1] == ("ack", "b")
    finally:
        loop.cancel()


async def test_a_held_ack_goes_out_when_the_publish_was_refused_and_when_the_relay_stopped() -> None:
    # The ack says the accept committed, which a refused publish does not change
    transport = _RecordingTransport()
    transport.gate.set()
    transport.refuse = 1
    relay = EventRelay(None, transport, route="r", interval=60.0)  # type: ignore[arg-type]
    relay.send([_event("a", 1, "accepted")])
    await relay.ack(_Delivery(transport.record, "a"))  # type: ignore[arg-type]
    await relay.publish_pending()
    assert transport.published == [] and transport.record[-1] == ("ack", "a")

    # A relay stopped mid-publish keeps its held acks for the stopping worker to send
    stuck = _RecordingTransport()
    relay = EventRelay(None, stuck, route="r", interval=60.0)  # type: ignore[arg-type]
    relay.send([_event("b", 1, "accepted")])
    await relay.ack(_Delivery(stuck.record, "b"))  # type: ignore[arg-type]
    publishing = asyncio.create_task(relay.publish_pending())
    await asyncio.sleep(0.05)
    publishing.cancel()
    await asyncio.gather(publishing, return_exceptions=True)
    assert stuck.record == []
    await relay.ack_held()
    assert stuck.record == [("ack", "b")]


async def test_commands_handed_over_while_a_publish_is_in_flight_go_out_at_once() -> None:
    transport = _GatedTransport()
    relay = CommandRelay(transport, retry_after=60.0)  # type: ignore[arg-type]
    loop = asyncio.create_task(relay.run())
    try:
        relay.send([("q", b"command1", "m1")])
        await asyncio.sleep(0.05)
        relay.send([("q", b"command2", "m2")])
        transport.gate.set()

        async def both() -> bool:
            return len(transport.published) == 2

        await wait_for(both, timeout=5, interval=0.01, what="both")
        assert relay.published == 2
    finally:
        loop.cancel()


async def test_a_relay_stopped_mid_publish_keeps_the_batch_for_the_flush_that_follows() -> None:
    # Given a publish in flight when the Brain stops (its relay task is cancelled)
    transport = _GatedTransport()
    relay = CommandRelay(transport, retry_after=60.0)  # type: ignore[arg-type]
    loop = asyncio.create_task(relay.run())
    relay.send([("q", b"command1", "m1")])
    await asyncio.sleep(0.05)
    loop.cancel()
    await asyncio.gather(loop, return_exceptions=True)

    # Then the shutdown's flush publishes it: it is not lost with the cancelled task
    transport.gate.set()
    await relay.flush()
    assert transport.published == [[("command", 1)]] and relay.published == 1


def _command(queue: str, n: int, args: Any = None) -> tuple[str, bytes, str]:
    """A command as the relay is handed it: (queue, its encoded envelope, its message id)."""
    body = ExecuteBody(
        turn_id="t", call_id=f"c{n}", route=queue, tool="echo", binding_digest="d" * 64,
        replay_policy="safe", args=args if args is not None else {"n": n},
    )  # fmt: skip
    command = ExecuteCommand(
        execution_id=f"e{n}",
        namespace="ns",
        session_id="s",
        request_digest=request_digest(f"e{n}", body),
        body=body,
    )
    return queue, encode(command), command.message_id


def _carried(message: tuple[str, bytes, str]) -> list[str]:
    envelope = decode(message[1])
    return (
        [c.execution_id for c in envelope.commands]
        if isinstance(envelope, CommandBatch)
        else [envelope.execution_id]
    )


def test_commands_for_one_queue_travel_together_and_a_lone_one_as_it_is() -> None:
    a1, b1, a2, a3 = _command("qa", 1), _command("qb", 2), _command("qa", 3), _command("qa", 4)
    messages = bundled([a1, b1, a2, a3])
    assert [(m[0], _carried(m)) for m, _ in messages] == [("qa", ["e1", "e3", "e4"]), ("qb", ["e2"])]
    (batch, carried), (lone, alone) = messages
    assert carried == [a1, a2, a3] and alone == [b1]
    assert lone == b1  # the same bytes and message id as it was handed over
    decoded = decode(batch[1])
    assert decoded.message_id == batch[2] and encode(decoded) == batch[1]  # canonical, as if encoded


def test_a_batch_stops_at_its_count_and_its_bytes_unless_one_command_alone_is_bigger() -> None:
    many = [_command("q", n) for n in range(2 * BATCH_COMMANDS + 5)]
    sizes = [len(carried) for _, carried in bundled(many)]
    assert sizes == [BATCH_COMMANDS, BATCH_COMMANDS, 5]
    assert [c for _, carried in bundled(many) for c in carried] == many  # in order, each once
    big = [_command("q", n, {"text": "x" * 400}) for n in range(5)]
    budget = 2 * len(big[0][1]) + 10
    assert [len(carried) for _, carried in bundled(big, max_bytes=budget)] == [2, 2, 1]
    huge = _command("q", 9, {"text": "x" * 5000})
    assert [len(c) for _, c in bundled([big[0], huge, big[1]], max_bytes=budget)] == [1, 1, 1]


@pytest.mark.parametrize("n", [1, 3], ids=["a lone command", "a batch"])
async def test_commands_the_broker_refused_are_published_again_after_a_pause_all_of_them(n: int) -> None:
    transport = _GatedTransport()
    transport.gate.set()
    transport.refuse = 1  # the first message: the lone command, or the batch that carries all three
    relay = CommandRelay(transport, retry_after=0.1)  # type: ignore[arg-type]
    loop = asyncio.create_task(relay.run())
    try:
        relay.send([_command("q", i) for i in range(1, n + 1)])

        async def sent() -> bool:
            return transport.published == [[("command", i) for i in range(1, n + 1)]]

        await wait_for(sent, timeout=5, interval=0.01, what="the commands, once the broker takes them")
        assert (relay.published, relay.messages) == (n, 1)
    finally:
        loop.cancel()
