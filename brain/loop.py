"""The agent loop as a persisted state machine.

A driver claims one turn (a new run under a lease with a fresh epoch) and executes its
current phase; every phase ends in one fenced commit that names the next phase, so a Brain
that dies anywhere resumes at the last committed phase with a new run of the same turn.
Model calls happen outside transactions; tool waits are rows, not coroutines.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import asyncpg
from structlog.contextvars import bound_contextvars

from brain.agents import AgentDefinition
from brain.models import Message, make_model
from brain.retry import RetryPolicy
from brain.states import TurnPhase, TurnStatus
from brain.store import events, executions, repairs, turns
from brain.store.turns import Lease
from infra.db import is_transient, patiently, transact
from infra.killpoints import KillPoints
from infra.logging import get_logger
from infra.payloads import PayloadCodec
from infra.transport import Topology
from protocol import (
    ExecuteBody,
    ExecuteCommand,
    IllegalTransitionError,
    LimitReachedError,
    RoutingError,
    StaleOwnerError,
    TendonError,
    new_id,
    request_digest,
)

log = get_logger(__name__)
T = TypeVar("T")


class FrozenThreads:
    """Agent definitions and frozen threads, read once per Brain process, not once per run.

    Neither changes once written: an agent version is immutable (a different definition under
    the same version is refused at submit), and a thread's bindings, once frozen, stay. A
    thread whose bindings are not frozen yet is read every time. Bounded: when full, it
    starts over (a re-read is always correct).
    """

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self._agents: dict[tuple[str, str], AgentDefinition] = {}
        self._threads: dict[str, Mapping[str, Any]] = {}

    async def get(
        self, conn: asyncpg.Connection, thread_id: str
    ) -> tuple[AgentDefinition, Mapping[str, Any]]:
        thread = self._threads.get(thread_id)
        if thread is None:
            thread = await conn.fetchrow("SELECT * FROM threads WHERE id = $1", thread_id)
            if thread["bindings"] is not None:
                self._keep(self._threads, thread_id, thread)
        key = (thread["agent_name"], thread["agent_version"])
        agent = self._agents.get(key)
        if agent is None:
            definition = await conn.fetchval(
                "SELECT definition FROM agents WHERE name = $1 AND version = $2", *key
            )
            agent = AgentDefinition.model_validate(definition)
            self._keep(self._agents, key, agent)
        return agent, thread

    def keep_frozen(self, thread: Mapping[str, Any]) -> None:
        """Keep a thread whose bindings a transaction froze (call after it committed)."""
        self._keep(self._threads, thread["id"], thread)

    def _keep(self, cache: dict[Any, Any], key: Any, value: Any) -> None:
        if len(cache) >= self.limit:
            cache.clear()
        cache[key] = value


@dataclass
class LoopContext:
    """What the phase handlers share: the database, codec, topology and knobs."""

    pool: asyncpg.Pool
    codec: PayloadCodec
    topology: Topology
    killpoints: KillPoints
    wake_channel: str
    lease_seconds: float
    binding_wait_seconds: float
    outbox_ready: Callable[[], None]
    retry: RetryPolicy = RetryPolicy()
    threads: FrozenThreads = field(default_factory=FrozenThreads)  # shared by the drivers
    # Turns whose runs are in progress in this process: the liveness keeper renews their
    # leases, so a phase longer than a lease is not taken over while this Brain lives.
    active: set[str] = field(default_factory=set)


class TurnDriver:
    """Drives claimed turns phase by phase until they wait, finish, or lose their lease.

    Phases that only touch the database (prepare, wait check, apply results, finalize) run
    in the transaction of the commit before them: the claim, or the model reply. So a turn
    costs one commit per model step and one per wake-up, not one per phase, while every
    commit still moves the turn from one committed phase to another (invariant 2).
    """

    def __init__(self, ctx: LoopContext, owner: str, on_claim: Callable[[], None] = lambda: None) -> None:
        self.ctx = ctx
        self.owner = owner
        self.on_claim = on_claim  # another turn may be claimable too: pass the hint on
        self._freezing: list[Mapping[str, Any]] = []  # threads frozen by the open transaction
        self._db_phases: dict[TurnPhase, DbPhase] = {
            TurnPhase.PREPARE: self._prepare,
            TurnPhase.WAIT_TOOLS: self._wait_tools,
            TurnPhase.APPLY_RESULTS: self._apply_results,
            TurnPhase.FINALIZE: self._finalize,
        }

    async def run_one(self, *, look_first: bool = True) -> Next:
        """Claim and drive one turn; say what this driver should do next.

        ``look_first``: a cheap read first, so that a driver with no reason to expect a turn
        opens no claim transaction. After a wake hint the claim is tried at once.
        """
        if look_first:
            async with self.ctx.pool.acquire() as conn:
                if not await turns.anything_claimable(conn):
                    return Next.WAIT
        claimed = await self._claim()
        if claimed is None:
            return Next.WAIT
        lease, started, row, more = claimed
        if more:
            self.on_claim()
        self.ctx.active.add(lease.turn_id)
        try:
            with bound_contextvars(turn_id=lease.turn_id, run_id=lease.run_id):
                log.info("run_started", phase=started, epoch=lease.epoch)
                try:
                    await self._drive(lease, row)
                except StaleOwnerError as exc:
                    log.warning("run_fenced_out", reason=str(exc))
                except Exception as exc:  # noqa: BLE001 - every failure ends this run somehow
                    await self._end_run_after(lease, exc)
        finally:
            self.ctx.active.discard(lease.turn_id)
        return after_run(more)

    async def _claim(self) -> tuple[Lease, str, asyncpg.Record | None, bool] | None:
        """Claim a turn and run its database-only phases in the same transaction.

        Returns the lease, the phase the run started at, the turn row to go on with (None
        when the run already ended, e.g. the turn is waiting again), and whether another turn
        was claimable at the claim. If a phase fails, the
        fused transaction rolls back and the turn is claimed alone, so that the failure is met
        again by the run and handled like any other (retry or failed turn).
        """

        async def claim(
            conn: asyncpg.Connection, fuse: bool
        ) -> tuple[Lease, str, asyncpg.Record | None, bool] | None:
            claimed = await turns.claim(conn, self.owner, self.ctx.lease_seconds)
            if claimed is None:
                return None
            lease, row, more = claimed
            after = await self._db_steps(conn, lease=lease, row=row) if fuse else row
            return lease, row["phase"], after, more

        try:
            return await self._transact(lambda c: claim(c, True))
        except Exception as exc:
            if is_transient(exc):
                raise
            log.info("fused_claim_rolled_back", error=repr(exc))
            return await self._transact(lambda c: claim(c, False))

    async def _end_run_after(self, lease: Lease, exc: Exception) -> None:
        """Retry a passing fault later (persisted backoff); fail the turn for anything else.

        Either is one commit, which waits out a database that is away (while this run holds
        the lease, nobody else would take the turn anyway); if it never comes back within the
        lease, the lease runs out and another run takes over.
        """
        if is_transient(exc) or (isinstance(exc, TendonError) and exc.retryable):
            log.warning("run_interrupted", error=repr(exc))
            try:
                await patiently(
                    lambda: self._transact(lambda c: self._schedule_retry(c, lease, exc)),
                    what="the retry of an interrupted run",
                    patience=self.ctx.lease_seconds,
                )
                return
            except StaleOwnerError:
                return
            except LimitReachedError as exhausted:
                await self._fail(lease, exhausted.as_dict())
                return
            except Exception as again:  # noqa: BLE001
                log.warning("retry_not_scheduled", error=repr(again))
                return
        if isinstance(exc, TendonError):
            error = exc.as_dict()
        else:
            log.exception("run_crashed")
            error = {"code": "internal_error", "message": f"{type(exc).__name__}: {exc}"}
        await self._fail(lease, error)

    async def _schedule_retry(self, conn: asyncpg.Connection, lease: Lease, exc: Exception) -> None:
        retries = await conn.fetchval("SELECT retries + 1 FROM turns WHERE id = $1", lease.turn_id)
        if self.ctx.retry.exhausted(retries):
            raise LimitReachedError(f"gave up after {retries - 1} retries; last error: {exc}")
        await turns.advance(
            conn,
            lease,
            release=True,
            retries=retries,
            wake_at=await conn.fetchval(
                "SELECT now() + make_interval(secs => $1)", self.ctx.retry.delay(retries)
            ),
            detail={"retry": retries, "error": repr(exc)},
        )

    async def _drive(self, lease: Lease, row: asyncpg.Record | None) -> None:
        """Go on from ``row`` (what this run's last commit returned) until the run ends."""
        while row is not None:
            if row["status"] != TurnStatus.RUNNING:
                return
            phase = TurnPhase(row["phase"])
            if phase is TurnPhase.MODEL_REQUEST:
                row = await self._model_request(lease, row)
            elif phase is TurnPhase.DISPATCH_TOOLS:
                row = await self._dispatch_tools(lease, row)
            elif phase in self._db_phases:
                row = await self._transact(partial(self._db_steps, lease=lease, row=row, lock=True))
            else:
                raise IllegalTransitionError(f"a running turn in phase {phase} has nothing left to do")

    async def _db_steps(
        self, conn: asyncpg.Connection, *, lease: Lease, row: asyncpg.Record | None, lock: bool = False
    ) -> asyncpg.Record | None:
        """Run database-only phases inside the caller's transaction while there are any.

        The transaction must hold the turn's row lock before a phase reads executions (see
        ``_wait_tools``): a claim or an advance in it took the lock already, else ``lock``.
        """
        if lock and row is not None:
            await conn.execute("SELECT 1 FROM turns WHERE id = $1 FOR UPDATE", lease.turn_id)
        while row is not None and row["status"] == TurnStatus.RUNNING:
            step = self._db_phases.get(TurnPhase(row["phase"]))
            if step is None:
                break
            row = await step(conn, lease, row)
        return row

    async def _agent_and_thread(
        self, conn: asyncpg.Connection, row: asyncpg.Record
    ) -> tuple[AgentDefinition, Mapping[str, Any]]:
        return await self.ctx.threads.get(conn, row["thread_id"])

    async def _transact(self, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """``transact`` for this driver's commits; threads they froze are kept once committed."""

        async def attempt(conn: asyncpg.Connection) -> T:
            self._freezing = []  # what an attempt that rolled back froze is not kept
            return await work(conn)

        try:
            result = await transact(self.ctx.pool, attempt)
        except BaseException:
            self._freezing = []
            raise
        for thread in self._freezing:
            self.ctx.threads.keep_frozen(thread)
        self._freezing = []
        return result

    # ---- phases ---------------------------------------------------------------------------
    # Database-only phases run inside the caller's transaction and return the turn row to go
    # on with, or None when this run ends (the turn waits, finished, or was released).

    async def _prepare(
        self, conn: asyncpg.Connection, lease: Lease, row: asyncpg.Record
    ) -> asyncpg.Record | None:
        agent, thread = await self._agent_and_thread(conn, row)
        if thread["bindings"] is None:
            found = await _latest_bindings(conn, agent.tools)
            missing = sorted(set(agent.tools) - set(found))
            if missing:
                deadline = await conn.fetchrow(
                    """SELECT created_at < now() - make_interval(secs => $2) AS overdue,
                              created_at + make_interval(secs => $2) AS at
                         FROM turns WHERE id = $1""",
                    lease.turn_id,
                    self.ctx.binding_wait_seconds,
                )
                if deadline["overdue"]:
                    raise _no_binding(missing, self.ctx.binding_wait_seconds)
                # Waiting is a row: woken when a pool announces bindings, or at the deadline.
                await turns.advance(
                    conn,
                    lease,
                    phase=TurnPhase.PREPARE,
                    status=TurnStatus.WAITING,
                    release=True,
                    waiting_for=f"a Hands pool to announce {', '.join(missing)}",
                    wake_at=deadline["at"],
                )
                return None
            # Freeze the bindings into the thread: later turns use these digests.
            frozen = await conn.execute(
                "UPDATE threads SET bindings = $2 WHERE id = $1 AND bindings IS NULL",
                thread["id"],
                found,
            )
            if frozen.endswith(" 1"):  # else another Brain froze it first: read it next time
                self._freezing.append({**thread, "bindings": found})
        await turns.append_history(conn, row["thread_id"], lease.turn_id, "user", row["input"])
        await events.append(conn, row["session_id"], lease.turn_id, "turn.prepared", {})
        return await turns.advance(
            conn,
            lease,
            phase=TurnPhase.MODEL_REQUEST,
            waiting_for=None,
            lease_seconds=self.ctx.lease_seconds,
        )

    async def _model_request(self, lease: Lease, row: asyncpg.Record) -> asyncpg.Record | None:
        """Call the model outside any transaction, then commit its reply together with what
        follows from it: the tool intents (dispatch) or the turn's result (finalize)."""
        async with self.ctx.pool.acquire() as conn:
            agent, thread = await self._agent_and_thread(conn, row)
            entries = await turns.history(conn, row["thread_id"])
        if row["model_calls"] >= agent.limits.max_model_calls:
            raise _limit(agent.limits.max_model_calls)
        history = [Message(role=e["role"], turn_id=e["turn_id"], content=e["content"]) for e in entries]
        model = make_model(agent.model)
        # Outside any transaction: a slow model never holds a row lock.
        reply = await model.complete(
            instructions=agent.instructions,
            history=history,
            turn_id=lease.turn_id,
            tools=list((thread["bindings"] or {}).values()),
        )
        content: dict[str, Any] = {"text": reply.content}
        calls = [c.model_dump() for c in reply.tool_calls]
        if calls:
            content["tool_calls"] = calls
        next_phase = TurnPhase.DISPATCH_TOOLS if calls else TurnPhase.FINALIZE
        intents: list[_Intent] | None = None
        if calls:
            try:
                intents = await self._intents(lease, row, thread, calls)
            except TendonError:
                intents = None  # the reply is committed alone; the dispatch phase meets it again

        async def commit(conn: asyncpg.Connection) -> asyncpg.Record | None:
            await turns.record_reply(
                conn,
                lease,
                thread_id=row["thread_id"],
                session_id=row["session_id"],
                reply=reply.model_dump(mode="json"),
                usage=reply.usage,
                content=content,
                tool_calls=len(calls),
            )
            model_calls = row["model_calls"] + 1
            # Dispatch and finalize have nothing to write before their own work: the turn
            # passes through them in the same move.
            if intents is not None:
                await self._commit_intents(conn, lease, row, intents, model_calls=model_calls)
                return None  # the turn waits for its tools
            if next_phase is TurnPhase.FINALIZE:
                return await self._finalize(conn, lease, row, content=content, model_calls=model_calls)
            after = await turns.advance(
                conn,
                lease,
                phase=next_phase,
                model_calls=model_calls,
                lease_seconds=self.ctx.lease_seconds,
            )
            return await self._db_steps(conn, lease=lease, row=after)

        after = await self._transact(commit)
        if intents is not None:
            self._after_intents(intents)
        return after

    async def _dispatch_tools(self, lease: Lease, row: asyncpg.Record) -> asyncpg.Record | None:
        """Dispatch the last reply's tool calls (a run that resumes at this phase)."""
        async with self.ctx.pool.acquire() as conn:
            _agent, thread = await self._agent_and_thread(conn, row)
            last = (await turns.history(conn, row["thread_id"]))[-1]
        intents = await self._intents(lease, row, thread, last["content"]["tool_calls"])
        await self._transact(lambda c: self._commit_intents(c, lease, row, intents))
        self._after_intents(intents)
        return None  # the turn waits for its tools

    async def _intents(
        self, lease: Lease, row: asyncpg.Record, thread: asyncpg.Record, calls: list[dict[str, Any]]
    ) -> list[_Intent]:
        """Build (and, when big, upload) the execute command of every tool call."""
        bindings: dict[str, Any] = thread["bindings"] or {}
        intents = []
        for call in calls:
            binding = bindings.get(call["tool"])
            if binding is None:
                raise _unbound(call["tool"], sorted(bindings))
            execution_id = f"exe-{new_id()}"
            body = ExecuteBody(
                turn_id=lease.turn_id,
                call_id=call["call_id"],
                route=binding["route"],
                tool=binding["name"],
                binding_digest=binding["digest"],
                replay_policy=binding["replay_policy"],
                args=call["args"],
            )
            envelope = ExecuteCommand(
                execution_id=execution_id,
                namespace=row["namespace"],
                session_id=row["session_id"],
                request_digest=request_digest(execution_id, body),
                body=body,
            )
            # Upload of a big body happens before the commit: content-addressed, so a crash
            # here leaves at most an unreferenced object, never a reference to nothing.
            payload = await self.ctx.codec.pack(envelope)
            intents.append(_Intent(call, binding, envelope, payload))
        return intents

    async def _commit_intents(
        self,
        conn: asyncpg.Connection,
        lease: Lease,
        row: asyncpg.Record,
        intents: list[_Intent],
        *,
        model_calls: int | None = None,
    ) -> None:
        """Executions + outbox commands (invariant 3), then the turn waits for them.

        ``model_calls``: the count after the reply committed in this transaction; the turn
        then moves from that reply through DISPATCH_TOOLS in the same UPDATE.
        """
        step = row["tool_step"] + 1
        for intent in intents:
            call, binding, envelope = intent.call, intent.binding, intent.envelope
            await executions.insert_intent(
                conn,
                execution_id=envelope.execution_id,
                turn_id=lease.turn_id,
                tool_step=step,
                call_id=call["call_id"],
                binding=binding,
                args=call["args"],
                request_digest=envelope.request_digest,
                command_message_id=envelope.message_id,
                command=(self.ctx.topology.commands(binding["route"]), intent.payload),
                session_id=row["session_id"],
            )
        from_reply: dict[str, Any] = {} if model_calls is None else {"model_calls": model_calls}
        await turns.advance(
            conn,
            lease,
            phase=TurnPhase.WAIT_TOOLS,
            via=[TurnPhase.DISPATCH_TOOLS] if from_reply else (),
            status=TurnStatus.WAITING,
            release=True,
            tool_step=step,
            waiting_for=f"{len(intents)} tool execution(s)",
            detail={"executions": [i.envelope.execution_id for i in intents]},
            **from_reply,
        )

    def _after_intents(self, intents: list[_Intent]) -> None:
        for intent in intents:
            self.ctx.killpoints.hit("brain.after_intent_commit", intent.call["call_id"])
        self.ctx.outbox_ready()

    async def _wait_tools(
        self, conn: asyncpg.Connection, lease: Lease, row: asyncpg.Record
    ) -> asyncpg.Record | None:
        # The turn is locked (see _db_steps) before executions are read: an update committing
        # concurrently either is visible here or finds the turn WAITING and wakes it.
        rows = await executions.for_step(conn, lease.turn_id, row["tool_step"])
        if executions.all_terminal(rows):
            return await self._apply_results(conn, lease, row, results=rows)
        pending = [r for r in rows if r["status"] not in ("succeeded", "failed", "cancelled")]
        unknown = [r for r in pending if r["status"] == "unknown"]
        reason = (
            f"reconcile of {len(unknown)} UNKNOWN execution(s): "
            + ", ".join(f"{r['id']} ({r['tool']} {r['call_id']})" for r in unknown)
            if unknown
            else f"{len(pending)} tool execution(s)"
        )
        await turns.advance(
            conn,
            lease,
            phase=TurnPhase.WAIT_TOOLS,
            status=TurnStatus.WAITING,
            release=True,
            waiting_for=reason,
        )
        return None

    async def _apply_results(
        self,
        conn: asyncpg.Connection,
        lease: Lease,
        row: asyncpg.Record,
        *,
        results: list[asyncpg.Record] | None = None,
    ) -> asyncpg.Record | None:
        """``results``: the step's executions, final, as the wait check just read them; the
        turn then moves from WAIT_TOOLS through APPLY_RESULTS in one UPDATE."""
        via = [TurnPhase.APPLY_RESULTS] if results is not None else []
        if results is None:
            results = await executions.for_step(conn, lease.turn_id, row["tool_step"])
        for r in results:
            await turns.append_history(
                conn,
                row["thread_id"],
                lease.turn_id,
                "tool",
                {
                    "call_id": r["call_id"],
                    "tool": r["tool"],
                    "execution_id": r["id"],
                    "status": r["status"],
                    "result": r["result"],
                    "error": r["error"],
                    "how": r["how"],
                },
            )
        return await turns.advance(
            conn,
            lease,
            phase=TurnPhase.MODEL_REQUEST,
            via=via,
            waiting_for=None,
            lease_seconds=self.ctx.lease_seconds,
        )

    async def _finalize(
        self,
        conn: asyncpg.Connection,
        lease: Lease,
        row: asyncpg.Record,
        *,
        content: dict[str, Any] | None = None,
        model_calls: int | None = None,
    ) -> asyncpg.Record | None:
        """``content`` and ``model_calls``: the final reply, committed in this transaction;
        the turn then moves from MODEL_REQUEST through FINALIZE in one UPDATE."""
        if content is None:
            content = (await turns.history(conn, row["thread_id"]))[-1]["content"]
        result = {"text": content.get("text")}
        from_reply: dict[str, Any] = {} if model_calls is None else {"model_calls": model_calls}
        await turns.advance(
            conn,
            lease,
            phase=TurnPhase.DONE,
            via=[TurnPhase.FINALIZE] if from_reply else (),
            status=TurnStatus.COMPLETED,
            release=True,
            result=result,
            **from_reply,
        )
        await events.append(conn, row["session_id"], lease.turn_id, "turn.completed", result)
        return None

    async def _fail(self, lease: Lease, error: dict[str, str]) -> None:
        log.error("turn_failed", **error)
        settled = 0

        async def commit(conn: asyncpg.Connection) -> None:
            nonlocal settled
            current = await turns.load(conn, lease.turn_id)
            await turns.advance(
                conn, lease, status=TurnStatus.FAILED, release=True, error=error, waiting_for=None
            )
            await events.append(conn, current["session_id"], lease.turn_id, "turn.failed", {"error": error})
            settled = await repairs.settle_open(conn, lease.turn_id, error, self.ctx.topology)

        try:
            await patiently(
                lambda: self._transact(commit), what="the failure of a turn", patience=self.ctx.lease_seconds
            )
            if settled:
                self.ctx.outbox_ready()  # the cancels for its executions
        except StaleOwnerError:
            pass
        except Exception as exc:  # noqa: BLE001
            # Not recorded: the lease expires and a later run meets the same error again.
            log.warning("failure_not_recorded", error=repr(exc))


@dataclass(frozen=True)
class _Intent:
    """One tool call about to be committed as an execution with its outbox command."""

    call: dict[str, Any]
    binding: dict[str, Any]
    envelope: ExecuteCommand
    payload: bytes


DbPhase = Callable[[asyncpg.Connection, Lease, asyncpg.Record], Awaitable[asyncpg.Record | None]]


async def _latest_bindings(conn: asyncpg.Connection, tools: list[str]) -> dict[str, Any]:
    """The most recently announced binding of each tool."""
    rows = await conn.fetch(
        "SELECT name, binding FROM bindings WHERE name = ANY($1::text[]) ORDER BY announced_at",
        tools,
    )
    return {r["name"]: r["binding"] for r in rows}  # later rows win


def _no_binding(missing: list[str], waited: float) -> TendonError:
    return RoutingError(
        f"no Hands pool announced tool(s) {', '.join(missing)} within {waited:g}s; "
        "start `hands serve --route ROUTE --tools MODULE` for them"
    )


def _unbound(tool: str, bound: list[str]) -> TendonError:
    return RoutingError(
        f"the model asked for tool {tool!r}, which this thread has no binding for "
        f"(bound: {', '.join(bound) or 'none'})"
    )


def _limit(n: int) -> TendonError:
    return LimitReachedError(f"the agent reached its limit of {n} model calls in one turn")


class Next(enum.Enum):
    """What a driver does once ``run_one`` returns."""

    CLAIM = "claim"  # another turn was claimable when this one was claimed: claim at once
    LOOK = "look"  # the run ended: a cheap look first (e.g. the next turn of its thread)
    WAIT = "wait"  # nothing was claimable: sleep until a wake hint or the scan interval


def after_run(more: bool) -> Next:
    """After a run: claim at once only if the claim saw another claimable turn.

    A claim transaction that finds nothing costs three round trips (BEGIN, claim, COMMIT)
    and the look one. Under load the claim almost always saw more, so nothing changes there;
    a lone turn's runs end in one look instead of an empty claim. Whatever became claimable
    since the claim (a submit, a tool's answer) sent a wake hint, kept if no driver was idle.
    """
    return Next.CLAIM if more else Next.LOOK


class Wakeups:
    """Wake-up hints shared by one Brain's drivers: each hint wakes one idle driver.

    Waking every driver on every hint would make each of them look at the database for the
    one turn that became claimable. Instead a driver whose claim saw another claimable turn
    passes the hint on (``on_claim``), so a burst of claimable turns still fans out over idle
    drivers, and a lone turn wakes no second driver for nothing. A hint
    that finds no driver idle is kept, so the next driver about to wait looks once more.
    """

    def __init__(self) -> None:
        self._idle: list[asyncio.Event] = []
        self._kept = False

    def hint(self, *_: Any) -> None:
        """Wake one idle driver (any arguments, so it can be a LISTEN callback)."""
        if self._idle:
            self._idle.pop().set()
        else:
            self._kept = True

    async def wait(self, at_most: float) -> bool:
        """Sleep until a hint or for ``at_most`` seconds; return at once for a kept hint.

        True when a hint ended the wait.
        """
        if self._kept:
            self._kept = False
            return True
        event = asyncio.Event()
        self._idle.append(event)
        try:
            await asyncio.wait_for(event.wait(), timeout=at_most)
            return True
        except TimeoutError:
            return False
        finally:
            if event in self._idle:
                self._idle.remove(event)


async def drive_forever(driver: TurnDriver, wakeups: Wakeups, interval: float) -> None:
    """Claim and drive turns; sleep until a wake hint or the periodic scan when idle.

    After a hint, or after a run whose claim saw more claimable turns, the claim is tried at
    once; otherwise (the periodic scan, the end of a lone run) a cheap look comes first.
    """
    after = Next.LOOK
    while True:
        try:
            after = await driver.run_one(look_first=after is not Next.CLAIM)
        except Exception as exc:  # noqa: BLE001 - e.g. the database is briefly unreachable
            # Nothing committed is lost; claim again after the scan interval.
            log.warning("driver_error", error=repr(exc))
            after = Next.WAIT
        if after is Next.WAIT:
            after = Next.CLAIM if await wakeups.wait(interval) else Next.LOOK
