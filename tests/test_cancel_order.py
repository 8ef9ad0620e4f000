"""The cancel guarantee on the Hands' side, whichever queue a worker reads first: a command whose
cancel waits on the control queue never starts its body.

A Hands worker runs in this process on the real PostgreSQL and RabbitMQ, the command and its
cancel waiting in their queues (the pool was down). The worker consumes one queue and only once
what that delivery does is in its ledger, the other: so the order of delivery is placed
exactly, where a real worker's two consumers race.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hands.app import Consuming, HandsApp
from hands.store import Ledger
from infra.transport import Transport
from tests import hands_test_tools as lab
from tests.hands_bus import Bus, cancel_of, command, ledger_fetch, runs
from tests.support import TendonEnv, wait_for

TOOLS = "tests.hands_test_tools"


class OrderedHands(HandsApp):
    """A Hands worker that consumes ``first`` (commands or controls), waits until ``landed``
    says what that did is in the ledger, then consumes the other queue."""

    def __init__(self, *args: Any, first: str, landed: Callable[[], Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.first_queue = first
        self.landed = landed

    async def _consume(self, ledger: Ledger, broker: Transport) -> None:
        commands, controls = self.topology.commands(self.route), self.topology.controls(self.route)
        handlers = {
            "commands": (commands, self.commands.handle),
            "controls": (controls, self.controls.handle),
        }
        first, then = (handlers[k] for k in sorted(handlers, key=lambda k: k != self.first_queue))
        opened = {first[0]: await broker.consume(*first, prefetch=self.concurrency)}
        await wait_for(self.landed, timeout=20, what=f"what the first delivery from {first[0]} did")
        opened[then[0]] = await broker.consume(*then, prefetch=self.concurrency)
        self._consuming = Consuming(controls=opened[controls], commands=opened[commands])


@pytest.mark.parametrize("first", ["commands", "controls"])
@pytest.mark.parametrize(("tool", "args"), [(lab.echo, {"text": "never"}), (lab.charge, {"amount": 5})])
async def test_a_command_whose_cancel_waits_on_the_control_queue_never_starts_whichever_comes_first(
    world: TendonEnv, bus: Bus, monkeypatch: pytest.MonkeyPatch, first: str, tool: Any,
    args: dict[str, Any],
) -> None:  # fmt: skip
    for name in ("LAB_RUNS_FILE", "LAB_CHARGES_FILE"):
        monkeypatch.setenv(name, world.extra[name])
    # Given a command and its cancel, both waiting in their queues while no worker serves the
    # route (a safe tool is accepted and started in one commit; an unsafe one in two)
    cmd = command(tool, args)
    await bus.publish_command(cmd)
    await bus.publish_control(cancel_of(cmd, "its turn was cancelled"))

    async def landed() -> Any:
        status = "SELECT status FROM executions WHERE execution_id = $1"
        return await ledger_fetch(world, status, cmd.execution_id)

    # When a worker starts and reads one of them first, and the other only once the first is in
    # its ledger (the command accepted, or the cancel's tombstone)
    app = OrderedHands(world.settings(), route="lab", tools=TOOLS, first=first, landed=landed)
    async with app:
        # Then the body never starts: the cancel leaves a tombstone the command is a duplicate
        # of, or the accepted command's body waits for the cancel waiting on the control queue
        # and finds its flag
        final = await bus.wait_kind(cmd.execution_id, "cancelled")
    rows = await landed()
    assert [r["status"] for r in rows] == ["cancelled"]
    assert runs(world) == []
    if first == "commands":
        assert final.body.reason == "cancel requested before the tool started"
    else:
        assert final.seq == 1 and "before its command arrived" in final.body.reason
