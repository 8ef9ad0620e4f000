"""The agent loop as a persisted state machine: this Brain's runs.

A :class:`Scheduler` claims turns for runs (several per claim, see ``brain.run.claims``) and drives
each as a task, at most ``capacity`` at once; a turn claimed elsewhere for this process (the
update consumer takes a turn whose tools just finished) is handed to it with :meth:`adopt`.
A run calls the model outside any transaction, then commits the reply with what follows from it
(its tool calls as executions, or the turn's result) as one :class:`~brain.store.Move`, batched
with the other runs' moves by the context's group committer. Every commit is fenced by the
lease epoch, so a Brain that dies anywhere resumes at the last committed phase with a new run of
the same turn; waiting for tools is a row, not a coroutine.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from structlog.contextvars import bound_contextvars

from brain.models.base import Message, ModelReply
from brain.rules import foreign, moves
from brain.rules.agents import AgentDefinition
from brain.rules.calls import check_tool_calls
from brain.rules.messages import next_message
from brain.rules.states import TERMINAL_TURN, TurnPhase, TurnStatus
from brain.run.calls import build_intents, refused_row, sent
from brain.run.claims import claim_turns
from brain.run.context import BrainContext
from brain.run.delegation import over_budget
from brain.run.interrupts import interrupted
from brain.store import TurnRow
from infra.db import Connection, is_transient, patiently
from infra.process.logging import get_logger
from protocol import (
    IllegalTransitionError,
    LimitReachedError,
    StaleOwnerError,
    TendonError,
)
from protocol.storable import describe, storable

log = get_logger(__name__)

# Seconds before a run that a service fault interrupted (the database or broker away) is tried again.
WEATHER_DELAY = 1.0


class Wakeups:
    """Wake-up hints (NOTIFY, a run that ended): one event, kept until the claim loop looks."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def hint(self, *_: Any) -> None:
        """Something may be claimable (any arguments, so it can be a LISTEN callback)."""
        self._event.set()

    async def wait(self, at_most: float) -> bool:
        """Sleep until a hint or for ``at_most`` seconds; True when a hint ended the wait (a hint
        that came while nobody waited ends the next wait at once)."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout=at_most)
        except TimeoutError:
            return False
        self._event.clear()  # not when cancelled: the hint stays for the next wait
        return True


class Scheduler:
    """Claims turns for this Brain's runs and drives each as a task, at most ``capacity`` at once.

    The capacity is a soft bound: a turn the update consumer claimed for this process is adopted
    even when a claim of the loop filled the last slot meanwhile."""

    def __init__(self, ctx: BrainContext, capacity: int, wakeups: Wakeups, interval: float) -> None:
        self.ctx = ctx
        self.capacity = capacity
        self.wakeups = wakeups
        self.interval = interval
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._slot = asyncio.Event()  # set when a run ended in a way worth a look
        self._full = False  # the claim loop waits for a free slot
        self.closed = False  # stopping: nothing more is claimed or driven here
        self.claimed: Counter[int] = Counter()  # claims by how many turns they took (for the bench)

    @property
    def free(self) -> int:
        return 0 if self.closed else max(0, self.capacity - len(self.tasks))

    def quiet(self) -> bool:
        """Few runs in progress here (under a quarter of the capacity): a turn submitted to this
        Brain now starts in its submit's commit. Busier, it is queued instead, and a claim takes
        several at once, which costs less per turn than a submit that claims alone (measured in
        docs/benchmarks/NOTES.md, ninth round)."""
        return not self.closed and len(self.tasks) < max(1, self.capacity // 4)

    def close(self) -> None:
        """Take no more turns (the first step of a stop): claims elsewhere see no free slot."""
        self.closed = True

    def adopt(self, row: TurnRow) -> None:
        """Drive ``row``, a turn this process holds the lease of (claimed in a commit elsewhere).
        Once closed, it is left to the lease: this Brain's retirement hands it back."""
        if row.id in self.tasks or self.closed:
            return
        self.tasks[row.id] = asyncio.create_task(self._drive(row), name=f"run-{row.id}")

    async def _drive(self, row: TurnRow) -> None:
        self.ctx.active.add(row.id)
        last: TurnRow | None = None
        try:
            with bound_contextvars(turn_id=row.id, run=row.runs):
                last = await drive(self.ctx, row)
        finally:
            self.ctx.active.discard(row.id)
            self.tasks.pop(row.id, None)
            # A run that left its turn waiting (for its tools, say) made nothing claimable: its
            # thread is still taken, and what wakes the turn hints. The claim loop looks again
            # only when it waits for a free slot, or the run ended otherwise (a turn that ended
            # frees its thread for the next queued turn, which nothing else hints).
            if self._full or last is None or last.status is not TurnStatus.WAITING:
                self._slot.set()

    async def run(self) -> None:
        """Claim turns whenever there are free slots and a reason to look; forever.

        After a hint, or a claim that saw more claimable turns than it took, the claim is tried at
        once; otherwise (the periodic scan, the end of a run) a cheap look comes first: a claim
        that finds nothing costs a transaction, the look one read."""
        # Not a BackgroundLoop: what comes next depends on the round (claim again at once, look
        # first, or wait for a free slot) and on which of two wake-ups ended the wait.
        claim_now = False
        while True:
            if self.free == 0:
                self._slot.clear()
                self._full = True
                try:
                    await self._slot.wait()
                finally:
                    self._full = False
                continue
            try:
                if claim_now or await self.ctx.store.turns.anything_claimable():
                    claim = await claim_turns(self.ctx, self.free)
                    self.claimed[len(claim.moved) + len(claim.settled)] += 1
                    for row in claim.runs:
                        self.adopt(row)
                    if claim.more:
                        claim_now = True
                        continue
            except Exception as exc:  # noqa: BLE001 - e.g. the database is briefly unreachable
                log.warning("claim_failed", error=repr(exc))  # nothing committed is lost
            self._slot.clear()
            claim_now = await self._idle()

    async def _idle(self) -> bool:
        """Until a hint (True: claim at once), a run ending that is worth a look (False: look
        first), or the interval."""
        hinted = asyncio.create_task(self.wakeups.wait(self.interval))
        freed = asyncio.create_task(self._slot.wait())
        done, pending = await asyncio.wait([hinted, freed], return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return hinted in done and hinted.result()

    async def stop(self, drain: float) -> None:
        """Let the runs in progress reach their next commit for up to ``drain`` seconds, then
        cancel the rest: nothing waits in memory, the next run redoes what did not commit (from
        the last committed phase)."""
        tasks = list(self.tasks.values())
        if not tasks:
            return
        self.ctx.draining = True
        pending = set(tasks)
        if drain > 0:
            _, pending = await asyncio.wait(tasks, timeout=drain)
        log.info("brain_drained", finished=len(tasks) - len(pending), cut_short=len(pending), drain=drain)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def drive(ctx: BrainContext, row: TurnRow) -> TurnRow | None:
    """Go on with a turn this run holds until it waits, ends or is lost; failures end it somehow.
    Returns the turn as the run last committed it (None: the run failed or was fenced out)."""
    current = row
    try:
        while current.status is TurnStatus.RUNNING and current.lease_owner == ctx.owner:
            if ctx.draining and current is not row:
                return current  # stopping: the phase committed, the retirement hands it back
            if current.pending:
                # Controls came during this run's phase: a claim applies them at this boundary.
                moved = await ctx.move(moves.hand_back(current))
                ctx.history.committed(current, moved.row, moved.seq, ())
                return moved.row
            if current.phase is TurnPhase.MODEL_REQUEST:
                current = await model_request(ctx, current)
            elif current.phase is TurnPhase.DISPATCH_TOOLS:
                current = await dispatch(ctx, current)
            else:
                raise IllegalTransitionError(f"a run has nothing to do in phase {current.phase}")
        if current.pending and current.status in TERMINAL_TURN:
            await _reject_leftover_controls(ctx, current)
        return current
    except StaleOwnerError as exc:
        log.warning("run_fenced_out", reason=str(exc))
    except Exception as exc:  # noqa: BLE001 - every failure ends this run somehow
        # A framework's run may have committed since ``current`` (brain.frameworks.run_foreign)
        turn = getattr(exc, "tendon_turn", current)
        await end_run_after(ctx, turn, exc, asked=turn.id in ctx.asked)
    finally:
        ctx.asked.discard(row.id)  # what a new run of the turn asks is its own attempt
    return None


async def _reject_leftover_controls(ctx: BrainContext, row: TurnRow) -> None:
    """Controls that came while the turn's last phase ran, and that it ended before applying."""
    store = ctx.store

    async def work(conn: Connection) -> None:
        said = await store.controls.reject_received(conn, row.id, f"the turn {row.status} first")
        if said:
            await store.journal.append(
                conn, row.session_id, row.id, said, thread_id=row.thread_id, status=str(row.status),
                phase=str(row.phase),
            )  # fmt: skip

    await store.transact(work)


async def model_request(ctx: BrainContext, row: TurnRow) -> TurnRow:
    """Call the model outside any transaction, then commit its reply with what follows from it."""
    if (ended := await over_budget(ctx, row)) is not None:
        return ended  # a child turn whose delegation budget is spent ended with what it had

    async def read(conn: Connection) -> Any:
        agent, thread = await ctx.threads.get(conn, row.thread_id)
        return agent, thread, await ctx.history.messages(conn, row)

    known, history = ctx.threads.known(row.thread_id), ctx.history.cached(row)
    if known is None or history is None:  # a claim usually read both already: no connection taken
        agent, thread, history = await ctx.store.read(read)
    else:
        agent, thread = known
    bindings: dict[str, Any] = thread["bindings"] or {}
    if agent.foreign:  # a framework's loop, replayed (brain.frameworks)
        return await ctx.foreign(ctx, row, agent, bindings, history)
    if row.model_calls >= agent.limits.max_model_calls:
        raise LimitReachedError(
            f"the agent reached its limit of {agent.limits.max_model_calls} model calls in one turn"
        )
    reply, call, trace = await _ask(ctx, row, agent, history, bindings)
    message: dict[str, Any] = {"text": reply.content}
    calls = [c.model_dump(exclude_none=True) for c in reply.tool_calls]
    intents = None
    if calls:
        message["tool_calls"] = calls
        check_tool_calls(agent, history, row, len(calls))
        try:
            intents = await build_intents(
                ctx, row, bindings, calls, detailed=agent.journal == "detailed", approvals=agent.approvals,
                trace=trace,
            )  # fmt: skip
        except TendonError as exc:
            log.warning("intents_not_built", error=exc.message)  # the dispatch phase meets it again
    move = moves.reply(row, message, reply.usage, call=call, intents=intents, first_look=ctx.first_look)
    moved = await ctx.move(move)
    ctx.asked.discard(row.id)
    refused = {i.execution_id: refused_row(i) for i in intents or () if not i.sends}
    ctx.history.committed(row, moved.row, moved.seq, move.facts, refused)
    if intents and not await interrupted(ctx, moved.row):
        sent(ctx, intents)
    return moved.row


async def _ask(
    ctx: BrainContext, row: TurnRow, agent: AgentDefinition, history: list[Message], bindings: dict[str, Any]
) -> tuple[ModelReply, dict[str, Any], str | None]:
    """The model's reply, the record of the call (its number, latency, model), and the trace its
    tool calls' commands continue."""
    model = ctx.models.get(agent.model)
    ctx.killpoints.hit("brain.before_model_call", str(row.model_calls + 1))
    started = time.perf_counter()
    attributes: dict[str, str | int] = {"tendon.turn_id": row.id, "tendon.model_call": row.model_calls + 1}
    mid, attempt = next_message(row.id, row.model_calls, row.model_attempt)
    with ctx.tracing.span("model call", attributes, turn=row.id) as span:
        ctx.asked.add(row.id)
        try:
            reply = await model.complete(
                instructions=agent.instructions,
                history=history,
                turn_id=row.id,
                tools=list(bindings.values()),
                on_delta=ctx.previews.sink(row.session_id, row.id, mid, attempt),
            )
        except Exception:
            ctx.metrics.model_failed.observe(time.perf_counter() - started)
            raise
    elapsed = time.perf_counter() - started
    ctx.metrics.model_replied.observe(elapsed)
    call: dict[str, Any] = {"number": row.model_calls + 1, "latency_ms": round(elapsed * 1000, 1)}
    if reply.model:
        call["model"] = reply.model
    return reply, call, ctx.tracing.carried(span)


async def dispatch(ctx: BrainContext, row: TurnRow) -> TurnRow:
    """Dispatch the last reply's tool calls (a run that resumes at this phase)."""

    async def read(conn: Connection) -> Any:
        agent, thread = await ctx.threads.get(conn, row.thread_id)
        return agent, thread, await ctx.history.messages(conn, row)

    agent, thread, history = await ctx.store.read(read)
    last = next(m for m in reversed(history) if m.role == "assistant" and m.turn_id == row.id)
    bindings = thread["bindings"] or {}
    intents = await build_intents(
        ctx, row, bindings, last.content["tool_calls"], detailed=agent.journal == "detailed",
        approvals=foreign.approvals(agent, last.content), trace=ctx.tracing.turn_parent(row.id),
    )  # fmt: skip
    move = moves.dispatch(row, intents, first_look=ctx.first_look)
    moved = await ctx.move(move)
    ctx.history.committed(row, moved.row, moved.seq, move.facts)
    if not await interrupted(ctx, moved.row):
        sent(ctx, intents)
    return moved.row


async def end_run_after(ctx: BrainContext, row: TurnRow, exc: Exception, *, asked: bool = False) -> None:
    """Retry a passing fault later (persisted backoff); fail the turn for anything else.

    A failed model call (or another retryable error) spends the turn's retry budget, which nothing
    resets; once it is spent the turn fails and no new model call is made. A service that blinked
    (the database or the broker away) spends nothing: that is weather (invariant 14), and the run
    is just tried again a moment later. Either is one commit, which waits out a database that is
    away (while this run holds the lease, nobody else would take the turn anyway); if it never
    comes back within the lease, the lease runs out and another run takes over. ``asked``: the
    fault ended a model call that had begun, whose attempt the retry supersedes."""
    if is_transient(exc) or (isinstance(exc, TendonError) and exc.retryable):
        log.warning("run_interrupted", error=repr(exc))
        if is_transient(exc):
            retries, delay = row.retries, WEATHER_DELAY
        else:
            retries = row.retries + 1
            agent, _ = await patiently(
                lambda: ctx.store.read(lambda conn: ctx.threads.get(conn, row.thread_id)),
                what="the agent of an interrupted run",
                patience=ctx.lease_seconds,
            )
            if agent.retry.exhausted(retries):
                spent = LimitReachedError(f"gave up after {retries - 1} retries; last error: {describe(exc)}")
                await fail(ctx, row, spent.as_dict())
                return
            delay = agent.retry.delay(retries, getattr(exc, "retry_after", None))
        move = moves.retry(row, retries=retries, delay=delay, error=describe(exc), asked=asked)
        try:
            await patiently(
                lambda: ctx.move(move),
                what="the retry of an interrupted run",
                patience=ctx.lease_seconds,
            )
        except StaleOwnerError:
            pass  # it landed after all, or another run has the turn now
        except Exception as again:  # noqa: BLE001 - then the lease runs out and another run retries
            log.warning("retry_not_scheduled", error=repr(again))
        return
    if isinstance(exc, TendonError):
        error = exc.as_dict()
    else:
        log.exception("run_crashed")
        error = {"code": "internal_error", "message": storable(f"{type(exc).__name__}: {exc}")}
    await fail(ctx, row, error)


async def fail(ctx: BrainContext, row: TurnRow, error: dict[str, str]) -> None:
    """Fail the turn this run holds, settling its open executions (their cancels go out)."""
    log.error("turn_failed", **error)

    async def commit() -> Any:
        return await ctx.store.transact(
            lambda conn: ctx.store.failures.fail_turn(conn, row.id, error, ctx.topology, lease=row.lease)
        )

    try:
        settled = await patiently(commit, what="the failure of a turn", patience=ctx.lease_seconds)
    except Exception as exc:  # noqa: BLE001
        # Not recorded: the lease expires and a later run meets the same error again.
        log.warning("failure_not_recorded", error=repr(exc))
        return
    if settled is not None:
        ctx.failed(settled)
