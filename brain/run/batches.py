"""Batch calls in a Brain process (``brain.rules.batches`` says what a batch is).

- :func:`batch_intents`: a batch call becomes, in the commit of the reply that made it, its own
  execution (PENDING until its children are settled, with its manifest) and one execution per item,
  each with its command packed now: the first ones INTENDED (sent once the commit is done, as any
  call), the others PENDING until admitted. A call the Brain cannot batch is refused as any call
  whose arguments do not fit.
- :func:`admit_after_apply`: in the transaction that applied children's ends, the next children are
  admitted (their commands go out after the commit, from memory; a send lost with this process is
  sent again by the repair scan, from their rows).
- :func:`admit_open`: the repair scan's look at the batches still open (a lost hint).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from brain.rules.batches import BINDING, ROUTE, child_call, child_id, manifest, parent_of
from brain.rules.calls import refused_intent
from brain.run.context import BrainContext
from brain.store import Intent, TurnRow
from infra.db import Connection

Message = tuple[str, bytes, str]  # queue, body, message id
# How a call sent to its route becomes an intent (``brain.run.calls``, which calls this module).
Pack = Callable[..., Awaitable[Intent]]


async def batch_intents(
    ctx: BrainContext,
    row: TurnRow,
    execution_id: str,
    call: Mapping[str, Any],
    bindings: Mapping[str, Any],
    *,
    detailed: bool,
    approvals: Collection[str],
    trace: str | None,
    pack: Pack,
) -> list[Intent]:
    """The batch call's intent (with its manifest) and its children's, in item order (each
    child's command packed by ``pack``)."""
    step = row.tool_step + 1
    try:
        frozen = manifest(call["args"], bindings, list(approvals))
    except ValueError as exc:
        return [refused_intent(execution_id, step, call, BINDING, str(exc), detailed=detailed)]
    children = []
    for index, item in enumerate(frozen.items):
        child = {"call_id": child_call(call["call_id"], index), "tool": frozen.tool, "args": item}
        intent = await pack(
            ctx, row, child_id(execution_id, index), child, frozen.binding, detailed=detailed, approval=False,
            trace=trace,
        )  # fmt: skip
        if index >= frozen.width:
            intent = dataclasses.replace(intent, status="pending", awaits="admission")
        children.append(intent)
    parent = Intent(
        execution_id=execution_id, tool_step=step, call_id=call["call_id"], route=ROUTE, tool=BINDING["name"],
        binding_digest=BINDING["digest"], replay_policy="safe", request_digest="-", command_message_id="-",
        command=None, queue="", journal_detail=detailed, status="pending", awaits="batch",
        batch={**frozen.row(), "items": list(frozen.items), "binding": dict(frozen.binding)},
    )  # fmt: skip
    return [parent, *children]


async def admit_after_apply(ctx: BrainContext, conn: Connection, ended: Collection[str]) -> list[Message]:
    """Admit what the children an apply ended make room for (inside its transaction, under the
    locks of their turns); the commands to send once it committed."""
    batches = {found[0] for e in ended if (found := parent_of(e)) is not None}
    if not batches:
        return []
    return await _advance(ctx, conn, sorted(batches))


async def admit_open(ctx: BrainContext, conn: Connection) -> list[Message]:
    """The repair scan's pass over the open batches: what a lost apply left to admit or settle."""
    open_ids = await ctx.store.batches.open_batches(conn)
    if not open_ids:
        return []
    return await _advance(ctx, conn, open_ids)


async def _advance(ctx: BrainContext, conn: Connection, batch_ids: list[str]) -> list[Message]:
    done = await ctx.store.batches.advance(conn, batch_ids, owner=ctx.owner, wake_channel=ctx.wake_channel)
    return [(ctx.topology.commands(route), body, message_id) for route, body, message_id in done.commands]
