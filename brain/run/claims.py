"""Claiming turns: several in one statement, each under a new run, and in the same transaction the
phases that only touch the database (prepare, the wait check, applying results, finalize), so
that what the claim hands to its runs is turns whose next step is a model call.

A turn whose phase fails here for good (its tools were never announced in time) fails in the
same transaction, alone: the others of the claim go on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from brain.rules import delegation, facts, moves
from brain.rules.agents import AgentDefinition
from brain.rules.batches import BUILTINS as BATCH_BUILTINS
from brain.rules.states import TERMINAL_TURN, TurnPhase, TurnStatus
from brain.rules.submits import Mark, Start, Submit, Submitted
from brain.rules.waits import BUILTINS as WAIT_BUILTINS
from brain.run.context import BrainContext
from brain.run.history import ReadAhead
from brain.store import Move, Moved, Settled, TurnRow
from infra.db import Connection
from infra.db.groupcommit import GroupCommit
from infra.process.logging import get_logger
from protocol import IllegalTransitionError, LimitReachedError, RoutingError, StaleOwnerError, TendonError

log = get_logger(__name__)

BUILTINS = WAIT_BUILTINS | BATCH_BUILTINS  # the tools the Brain answers itself


@dataclass
class Claim:
    """What one claim transaction did: the turns its runs go on with, and what to do once it
    committed (threads whose bindings it froze, cancels of turns it failed)."""

    runs: list[TurnRow] = field(default_factory=list)
    more: bool = False
    threads: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # of turns that freeze bindings
    # Read ahead for the turns it prepares, one statement each instead of two per turn: their
    # threads (with agents), and the announced bindings of the tools of threads not frozen yet.
    read: dict[str, tuple[AgentDefinition, Mapping[str, Any]]] = field(default_factory=dict)
    announced: dict[str, Any] | None = None
    steps: dict[tuple[str, int], list[Any]] = field(default_factory=dict)  # of turns back from tools
    history: ReadAhead | None = None  # the conversations of its runs, for their model calls
    moved: list[tuple[Move, Moved]] = field(default_factory=list)
    settled: list[Settled] = field(default_factory=list)


async def claim_turns(ctx: BrainContext, limit: int) -> Claim:
    """Claim up to ``limit`` turns and take their database-only phases; one transaction."""

    async def work(conn: Connection) -> Claim:
        claim = Claim()
        claimed = await ctx.store.turns.claim(conn, ctx.owner, ctx.lease_seconds, limit)
        claim.more = claimed.more
        await _read_ahead(ctx, conn, claimed.rows, claim)
        planned: list[Move] = []
        for row in claimed.rows:
            log.info("run_started", turn_id=row.id, run=row.runs, phase=str(row.phase), epoch=row.lease_epoch)
            try:
                planned.append(await _next_move(ctx, conn, row, claimed.now, claim))
            except TendonError as exc:
                if exc.retryable:
                    raise
                log.warning("turn_failed", turn_id=row.id, **exc.as_dict())
                settled = await ctx.store.failures.fail_turn(
                    conn, row.id, exc.as_dict(), ctx.topology, lease=row.lease, preface=[moves.started(row)]
                )
                if settled is not None:
                    claim.settled.append(settled)
        done = await ctx.store.turns.commit_moves(conn, planned, ctx.lease_seconds) if planned else []
        for move, moved in zip(planned, done, strict=True):
            if moved is None:  # claimed in this very transaction: nobody else can have moved it
                raise StaleOwnerError(f"turn {move.before.id} moved under its own claim")
            claim.moved.append((move, moved))
            if moved.row.status is TurnStatus.RUNNING and moved.row.phase in (
                TurnPhase.MODEL_REQUEST,
                TurnPhase.DISPATCH_TOOLS,
            ):
                claim.runs.append(moved.row)
        await _read_conversations(ctx, conn, claim)
        return claim

    claim = await ctx.store.transact(work)
    for move, moved in claim.moved:
        if moved.froze and move.freeze is not None:
            ctx.threads.keep_frozen(claim.threads[move.before.id], move.freeze)
        ctx.history.committed(move.before, moved.row, moved.seq, move.facts)
        if moved.row.status in TERMINAL_TURN:  # a cancel applied at this boundary, or a finalize
            ctx.ended(moved.row.id, str(moved.row.status), moved.row.created_at)
    if claim.history is not None:
        ctx.history.keep(claim.history, claim.runs)
    for settled in claim.settled:
        ctx.failed(settled)
    waiting = [
        m.row
        for _, m in claim.moved
        if m.row.status is TurnStatus.WAITING and m.row.phase is TurnPhase.PREPARE
    ]
    if waiting:
        await _look_again_for_bindings(ctx, waiting)
    return claim


async def _read_ahead(ctx: BrainContext, conn: Connection, rows: list[TurnRow], claim: Claim) -> None:
    back = [(r.id, r.tool_step) for r in rows if r.phase in (TurnPhase.WAIT_TOOLS, TurnPhase.APPLY_RESULTS)]
    if back:
        claim.steps = await ctx.store.executions.steps_executions(conn, back)
    preparing = {r.thread_id for r in rows if r.phase is TurnPhase.PREPARE}
    if not preparing:
        return
    claim.read = await ctx.threads.get_many(conn, preparing)
    tools = {t for agent, thread in claim.read.values() if thread["bindings"] is None for t in agent.tools}
    if tools:
        claim.announced = await ctx.store.bindings.latest_bindings(conn, sorted(tools))


async def _read_conversations(ctx: BrainContext, conn: Connection, claim: Claim) -> None:
    """What the model calls of the claim's runs need, read for all of them here (after their
    moves, in the same transaction) instead of once per run: the conversations, and the threads
    of turns not prepared in this claim (those it prepared were read ahead, or froze here and
    are kept once this commits)."""
    asking = [r for r in claim.runs if r.phase is TurnPhase.MODEL_REQUEST]
    if not asking:
        return
    frozen_here = {t["id"] for t in claim.threads.values()}
    await ctx.threads.get_many(conn, {r.thread_id for r in asking} - claim.read.keys() - frozen_here)
    known = {e["id"]: e for executions in claim.steps.values() for e in executions}
    upto = {m.row.id: m.seq for _, m in claim.moved if m.seq is not None}
    claim.history = await ctx.history.read_ahead(conn, asking, known, upto)


async def _look_again_for_bindings(ctx: BrainContext, rows: list[TurnRow]) -> None:
    """An announcement committed between the claim's look at the bindings and its commit woke
    nobody (the turn did not wait yet), and the turn would wait out its whole binding wait. Now
    that it waits as a row, look once more: either this sees the bindings, or their announcement
    comes later and wakes it."""

    async def work(conn: Connection) -> None:
        for row in rows:
            agent, _ = await ctx.threads.get(conn, row.thread_id)
            if set(agent.tools) - BUILTINS.keys() <= set(
                await ctx.store.bindings.latest_bindings(conn, agent.tools)
            ):
                await ctx.store.turns.wake_for_bindings(conn, ctx.wake_channel)
                return

    await ctx.store.transact(work)


def crash_loop(row: TurnRow) -> str:
    """Why a turn whose Brains keep dying at one point fails (instead of killing another)."""
    phase, calls, tool_step = (row.crash_at or "?#0#0").split("#")
    where = f"model call {int(calls) + 1}" if phase == TurnPhase.MODEL_REQUEST else f"tool step {tool_step}"
    return (
        f"its Brain died {row.crashes} times in a row at phase {phase} ({where}); "
        "it is failed instead of being run again"
    )


async def _next_move(ctx: BrainContext, conn: Connection, row: TurnRow, now: Any, claim: Claim) -> Move:
    """The move that takes a just-claimed turn to its next model call (or wait, or end)."""
    if row.crashes:
        agent, _ = await ctx.threads.get(conn, row.thread_id)
        if row.crashes >= agent.limits.max_crashes:
            raise LimitReachedError(crash_loop(row))
    added: list[dict[str, Any]] = []
    if row.pending or row.cancel_requested:
        stop, added = await _controls_at_boundary(ctx, conn, row)
        if stop is not None:
            return stop
    move = await _phase_move(ctx, conn, row, now, claim)
    return replace(move, facts=(*move.facts, *added)) if added else move


async def _controls_at_boundary(
    ctx: BrainContext, conn: Connection, row: TurnRow
) -> tuple[Move | None, list[Any]]:
    """Apply the controls that waited for this boundary: a cancel whose executions are settled
    ends the turn, a pause stops it here (the move to make instead of the next phase); steers and
    injects add their input (the facts to add to the next phase's move, after what it records, so
    that tool results stay right after the call that asked for them)."""
    store = ctx.store
    received = await store.controls.controls_of(conn, row.id, received_only=True)
    by_kind: dict[str, list[Any]] = {}
    for c in received:
        by_kind.setdefault(c["kind"], []).append(c)
    if row.cancel_requested or by_kind.get("cancel"):
        unsettled = await store.executions.open_executions(conn, row.id)
        if unsettled:
            return moves.wait_for_cancel(row, len(unsettled)), []
        cancels = by_kind.get("cancel", [])
        for c in cancels:  # each keeps its reason (a new message's interrupt says so)
            await store.controls.decide_controls(conn, [c["id"]], "applied", c["reason"])
        said = [facts.control(c["id"], "cancel", "applied", c["reason"]) for c in cancels]
        said += await store.controls.reject_received(conn, row.id, "the turn was cancelled")
        why = next((c["reason"] for c in cancels if c["reason"]), None)
        closed = await store.controls.closing(conn, row.id, row.phase, row.tool_step, why)
        return moves.cancel(row, [*closed, *said]), []
    if by_kind.get("pause"):
        pauses = [c["id"] for c in by_kind["pause"]]
        await store.controls.decide_controls(conn, pauses, "applied", None)
        await store.controls.add_pending(conn, row.id, -len(pauses))
        return moves.pause(row, [facts.control(c, "pause", "applied") for c in pauses]), []
    inputs = by_kind.get("steer", []) + by_kind.get("inject", [])
    inputs.sort(key=lambda c: c["id"])
    await store.controls.decide_controls(conn, [c["id"] for c in inputs], "applied", None)
    await store.controls.add_pending(conn, row.id, -len(inputs))
    added = []
    for c in inputs:
        added += [
            facts.input_added(c["id"], c["kind"], c["body"]["text"]),
            facts.control(c["id"], c["kind"], "applied"),
        ]
    return None, added


async def _phase_move(ctx: BrainContext, conn: Connection, row: TurnRow, now: Any, claim: Claim) -> Move:
    phase = row.phase
    if phase in (TurnPhase.MODEL_REQUEST, TurnPhase.DISPATCH_TOOLS):
        return moves.resume(row)
    if phase is TurnPhase.PREPARE:
        return await _prepare(ctx, conn, row, now, claim)
    if phase in (TurnPhase.WAIT_TOOLS, TurnPhase.APPLY_RESULTS):
        executions = claim.steps[(row.id, row.tool_step)]  # read for the whole claim
        if phase is TurnPhase.APPLY_RESULTS:
            return moves.apply_results(row, executions)
        return moves.wait_check(row, executions, first_look=ctx.first_look)
    if phase is TurnPhase.FINALIZE:
        history = await ctx.history.messages(conn, row)
        last = next(m for m in reversed(history) if m.role == "assistant" and m.turn_id == row.id)
        return moves.finalize(row, last.content)
    raise IllegalTransitionError(f"a running turn in phase {phase} has nothing left to do")


async def announced(
    ctx: BrainContext, conn: Connection, agent: AgentDefinition, known: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The bindings a new thread of ``agent`` would freeze now, and the tools no pool announced
    (``known``: the latest bindings of its tools, read already)."""
    return offered(
        agent, known if known is not None else await ctx.store.bindings.latest_bindings(conn, agent.tools)
    )


def offered(agent: AgentDefinition, latest: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """What a new thread of ``agent`` freezes given the ``latest`` announced bindings (its manual
    tools', its delegates' and the Brain's built-ins included: a built-in's name is the Brain's,
    whatever a pool announces), and the tools no pool announced."""
    found = {
        t: BUILTINS[t] if t in BUILTINS else latest[t] for t in agent.tools if t in BUILTINS or t in latest
    }
    missing = sorted(set(agent.tools) - set(found))
    found |= {m.name: m.binding() for m in agent.manual_tools}
    return found | delegation.bindings(agent.delegates), missing


async def _prepare(ctx: BrainContext, conn: Connection, row: TurnRow, now: Any, claim: Claim) -> Move:
    agent, thread = claim.read.get(row.thread_id) or await ctx.threads.get(conn, row.thread_id)
    if thread["bindings"] is not None:
        return moves.prepare(row, freeze=None)
    found, missing = await announced(ctx, conn, agent, claim.announced)
    if missing:
        waited = (now - row.created_at).total_seconds() if now is not None else 0.0
        if waited >= ctx.binding_wait_seconds:
            raise RoutingError(
                f"no Hands pool announced tool(s) {', '.join(missing)} within {ctx.binding_wait_seconds:g}s; "
                "start `hands serve --route ROUTE --tools MODULE` for them"
            )
        return moves.wait_for_bindings(row, missing, ctx.binding_wait_seconds - waited)
    # The thread keeps these from now on: later turns use these digests. If another Brain froze
    # it first, the cache reads the thread again next time.
    claim.threads[row.id] = thread
    return moves.prepare(row, freeze=found)


MAX_CHOSEN = 256  # tool sets whose chosen bindings a Brain keeps for its served submits


@dataclass
class Served:
    """Submits this Brain serves (its HTTP API). While few runs are in progress here (``quiet``),
    the submit's commit also claims and prepares a turn that can start at once (its thread idle,
    its tools announced), and a run here goes on with it: no wake-up, no claim commit, one
    journal entry fewer. Busier, the turn is queued, for claims that take several at once.

    The thread is locked first, so that two served submits cannot both find it idle; a plain
    submit racing with this one leaves its turn queued, and a queued turn never overtakes a
    started one of its thread (``CLAIMABLE_SQL``).

    Submits that arrive together share a statement and a commit (``submits``, a group committer:
    one statement for the submits of distinct sessions on PostgreSQL); each is answered once its
    turn is committed, with its own outcome or refusal."""

    ctx: BrainContext
    quiet: Callable[[], bool]
    adopt: Callable[[TurnRow], None]
    # For each set of tools, the bindings a new thread would freeze and the mark of the
    # announcements they were chosen from: offered again without a read until a submit finds
    # that the announcements changed (it then queues its turn, and the next one reads again).
    chosen: dict[tuple[str, ...], tuple[dict[str, Any], Mark]] = field(default_factory=dict)
    submits: GroupCommit[tuple[Submit, Start | None], Submitted] = field(init=False)

    def __post_init__(self) -> None:
        store = self.ctx.store
        self.submits = GroupCommit(
            # A submit looks its request id up and inserts it when missing: a race lost to
            # another process's insert of it is tried again, and then finds it.
            partial(store.transact, read_then_insert=True, held=store.held()),
            store.submits.submit_batch,
            name="submits",
            order=lambda item: item[0].session_key,  # rows locked in one order by every batch
            single=store.submits.submits_in_one_statement,
        )

    async def _offer(self, s: Submit) -> Start:
        """What the submit may start the turn with: a thread kept here with its bindings frozen
        needs nothing more; any other may be new, and then freezes the bindings announced now
        (chosen before the submit, which finds out whether the thread is there, and checks that
        the announcements are still those it was chosen from)."""
        ctx = self.ctx
        kept = ctx.threads.known(s.thread_id)
        if kept is not None and kept[1]["bindings"] is not None:
            return Start(ctx.owner, ctx.lease_seconds, None)
        tools = tuple(s.agent.tools)
        chosen = self.chosen.get(tools)
        if chosen is None:
            chosen = await ctx.store.read(lambda conn: ctx.store.bindings.marked_bindings(conn, tools))
        found, missing = offered(s.agent, chosen[0])
        if missing:  # not kept: an announcement may come at any moment, and nothing would say
            return Start(ctx.owner, ctx.lease_seconds, None)
        if tools not in self.chosen and len(self.chosen) >= MAX_CHOSEN:
            self.chosen.clear()  # agents with that many tool sets: a read each again, for a while
        self.chosen[tools] = chosen
        return Start(ctx.owner, ctx.lease_seconds, found, (tools, chosen[1]))

    async def submit(self, s: Submit) -> tuple[str, bool]:
        ctx = self.ctx
        done = await self.submits.submit((s, await self._offer(s) if self.quiet() else None))
        ctx.killpoints.hit("brain.after_submit_commit")  # the batch committed, its callers unanswered
        if done.stale:
            self.chosen.pop(tuple(s.agent.tools), None)
        row = done.started
        if row is not None:
            assert done.seq is not None
            log.info("run_started", turn_id=row.id, run=row.runs, phase="prepare", epoch=row.lease_epoch)
            if done.froze is not None:  # a new thread, as its row now stands
                thread = {
                    "id": row.thread_id, "session_id": row.session_id, "namespace": row.namespace,
                    "name": s.thread, "agent_name": s.agent.name, "agent_version": s.agent.version,
                    "closed_at": None,
                }  # fmt: skip
                ctx.threads.keep_frozen(thread, done.froze)
            ctx.history.started(row, done.seq, done.facts)
            self.adopt(row)
        return done.turn_id, done.created
