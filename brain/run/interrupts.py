"""A new message's interrupt at the boundary of a model call (``brain.rules.controls.at_boundary``):
the run lets the call finish and commits its reply, then, before sending any of the calls it asks
for, ends the turn there: the calls closed as cancelled, never sent, so that the next model call
(the new message's) sees the work so far and no call without its result."""

from __future__ import annotations

from brain.rules.states import TurnStatus
from brain.run.context import BrainContext
from brain.store import TurnRow


async def interrupted(ctx: BrainContext, row: TurnRow) -> bool:
    """Whether the reply this run just committed (``row``: the turn as it left it, waiting for its
    calls) was interrupted; then the turn ended, and its calls must not be sent."""
    if not row.pending or row.status is not TurnStatus.WAITING:
        return False  # no control came meanwhile (nearly always: nothing is read)
    store = ctx.store
    controls = await store.transact(
        lambda conn: store.controls.interrupt_at_boundary(conn, row, ctx.topology)
    )
    if controls is None:
        return False
    ctx.controls.send(controls)
    ctx.ended(row.id, str(TurnStatus.CANCELLED), row.created_at)
    return True
