"""The tools a sandbox route serves, each an ordinary Hands execution under its replay policy:

| tool | replay | what it does |
| --- | --- | --- |
| ``sandbox_exec`` | unsafe (re-attached, or asked) | a shell command: output pages, exit code, timeout |
| ``fs_upload`` | safe (same bytes, same file) | writes a file into the workspace |
| ``fs_download`` | safe | reads a file of the workspace (at most ``INLINE_LIMIT`` bytes) |
| ``artifact_publish`` | safe (content-addressed) | puts a workspace file into the object store |

Names use ``_``, not ``.``: model APIs take ``[A-Za-z0-9_-]`` in a tool name.

``sandbox_exec`` commits a durable handle (the binding and the operation's name) before it starts
the command's wrapper, so a worker that dies while the command runs leaves an execution that
the next worker re-attaches to through the operation log (``hands.sandbox.rules.oplog``):
waiting for the command or reading its finished exit code and output; the command never starts
twice. Its query says NotFound only when the log shows the command never started (a crash before
the handle): then running it is its first run. A command whose wrapper was lost without an exit
code (the sandbox stopped under it) is UNKNOWN, unless the call marked it ``idempotent``: then it
is run again, as a new operation.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any, Literal

from hands.sandbox.lifecycle import Lifecycle, Sandbox
from hands.sandbox.rules import oplog
from hands.sandbox.rules.paths import user_path
from hands.tools.declare import Found, NotFound, OutcomeUnknownError, Tool, ToolContext, tool
from infra.objects.payloads import ObjectStore
from infra.process.logging import get_logger
from protocol import SchemaError, TendonError

INLINE_LIMIT = 256 * 1024
PAGE = 64 * 1024
TAIL = 16 * 1024
POLL = 0.2
FIRST_LOOK = 0.02  # the pause after a launch, before the first look at the log
CANCEL_WAIT = 15.0
LAUNCHES = 3  # starts asked of a wrapper that the log does not show started
BLIND_ROUNDS = 20  # rounds in a row without an answer from the sandbox before its command is UNKNOWN
log = get_logger(__name__)


class CommandCancelledError(Exception):
    """The command was stopped by a cancel."""


class CommandNotStartedError(Exception):
    """The command's wrapper could not be started; it was fenced off, so the command never ran."""


class NoObjectStoreError(TendonError):
    code = "no_object_store"


def _handle(ctx: ToolContext) -> dict[str, Any]:
    return dict(json.loads(ctx.handle or "{}"))


async def _prepare(sb: Sandbox, op: str, command: str, timeout_seconds: float) -> None:
    """The command and its wrapper, written before anything starts (writing them again is harmless)."""
    await sb.write(f"{oplog.op_dir(op)}/cmd", command.encode())
    await sb.write(f"{oplog.op_dir(op)}/run.sh", oplog.wrapper(op, timeout_seconds).encode())


async def _probe(sb: Sandbox, op: str) -> oplog.OpState:
    return oplog.read_probe((await sb.shell(oplog.probe(op))).decode())


class _Follower:
    """Follows one command through its operation log to its end, paging its output: starts it
    where the log says nothing did (its lock makes a second start a no-op), rides out a provider
    that stops answering for a while, and asks a cancel until the command stops."""

    def __init__(self, sb: Sandbox, ctx: ToolContext, handle: dict[str, Any]) -> None:
        self.sb, self.ctx, self.handle = sb, ctx, handle
        self.offset = max(0, ctx.output_offset - int(handle.get("base", 0)))  # into this op's out
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.launches = 0
        self.blind = 0  # rounds in a row the provider did not answer
        self.cancel_since: float | None = None

    async def run(self, command: str, timeout_seconds: float, idempotent: bool) -> dict[str, Any]:
        since = time.monotonic()
        while True:
            op = self.handle["op"]
            state = await self._look(op)
            if state is None:
                continue
            if state.size > self.offset and await self._page(op):
                continue
            if state.phase is oplog.Phase.FINISHED:
                return await self._finished(op, state)
            if state.phase is oplog.Phase.NONE and self.launches < LAUNCHES:
                self.launches += 1
                await self._ask(oplog.launch(op))
                since = time.monotonic()
                await asyncio.sleep(FIRST_LOOK)
                continue
            waited = time.monotonic() - since
            if state.phase is oplog.Phase.FENCED or (
                state.phase is oplog.Phase.NONE and waited > oplog.STARTING_GRACE
            ):
                await self._fence(op)  # it never started: make sure it never does, and say so
                continue
            if state.phase is oplog.Phase.LOST or (
                state.phase is not oplog.Phase.RUNNING and waited > oplog.STARTING_GRACE
            ):
                if not idempotent:
                    raise OutcomeUnknownError(f"command {op}: its wrapper is gone without an exit code")
                await self._again(command, timeout_seconds)
                since = time.monotonic()
                continue
            if self.ctx.cancelled.is_set():
                await self._stop(op)
            # A short command is seen to end soon, a long one is looked at less often (at most
            # once a second): each look is a process in the sandbox (a `docker exec`).
            await asyncio.sleep(min(1.0, FIRST_LOOK + (time.monotonic() - since) / 5))

    async def _look(self, op: str) -> oplog.OpState | None:
        """What the log says, or None after a provider that did not answer (then resumed, and
        waited for); OutcomeUnknownError once it did not answer ``BLIND_ROUNDS`` times in a row."""
        try:
            state = await _probe(self.sb, op)
        except (TendonError, ValueError, OSError) as exc:
            self.blind += 1
            if self.blind >= BLIND_ROUNDS:
                raise OutcomeUnknownError(f"command {op}: the sandbox did not answer ({exc})") from exc
            with contextlib.suppress(Exception):
                await self.sb.backend.resume(self.sb.identity)  # a container the engine stopped
            await asyncio.sleep(POLL * 2)
            return None
        self.blind = 0
        return state

    async def _ask(self, script: str) -> None:
        """A launch or a stop: what it did is read back from the log, so a failure is only said."""
        try:
            await self.sb.shell(script)
        except (TendonError, OSError) as exc:
            log.warning("sandbox_step_failed", error=repr(exc))

    async def _fence(self, op: str) -> None:
        """Take the op's lock in the wrapper's stead: the command can never start after this, so
        the call fails, saying it never ran. If a wrapper took the lock first, it runs: follow it."""
        said = (await self.sb.shell(oplog.fence(op))).strip()
        if said == b"fenced" or (await _probe(self.sb, op)).phase is oplog.Phase.FENCED:
            raise CommandNotStartedError(
                f"command {op}: its wrapper did not start within {oplog.STARTING_GRACE:.0f} s, "
                "and now never will; it did not run"
            )

    async def _finished(self, op: str, state: oplog.OpState) -> dict[str, Any]:
        rest = self.decoder.decode(b"", final=True)  # an incomplete character at the very end
        if rest:
            await self.ctx.output.write(rest)
        tail = await self.sb.read(f"{oplog.op_dir(op)}/out", max(0, state.size - TAIL)) or b""
        if self.cancel_since is not None:
            raise CommandCancelledError(f"the command stopped on a cancel (exit {state.exit_code})")
        return oplog.outcome(state, tail.decode(errors="replace"))

    async def _stop(self, op: str) -> None:
        """Ask the command to stop (each round: it may not have been running yet the first time),
        TERM, then KILL; give up waiting after twice ``CANCEL_WAIT``."""
        if self.cancel_since is None:
            self.cancel_since = time.monotonic()
        waited = time.monotonic() - self.cancel_since
        if waited > 2 * CANCEL_WAIT:
            raise CommandCancelledError(f"command {op} was not seen to stop after a cancel")
        await self._ask(oplog.stop(op, "KILL" if waited > CANCEL_WAIT else "TERM"))

    async def _page(self, op: str) -> bool:
        data = await self.sb.read(f"{oplog.op_dir(op)}/out", self.offset, PAGE)
        if not data:
            return False
        self.offset += len(data)
        text = self.decoder.decode(data)
        if text:
            await self.ctx.output.write(text)
        return True

    async def _again(self, command: str, timeout_seconds: float) -> None:
        """An idempotent command whose run was lost: a new operation, its handle kept first."""
        n = int(self.handle.get("run", 1)) + 1
        op = f"{self.ctx.operation_id}.{n}"
        base = int(self.handle.get("base", 0)) + self.offset  # what the pages hold so far
        self.handle = {**self.handle, "op": op, "run": n, "base": base}
        self.offset, self.launches = 0, 0
        await _prepare(self.sb, op, command, timeout_seconds)
        await self.ctx.keep_handle(json.dumps(self.handle))


class _Tools:
    """The bodies of the four tools, working in the sandboxes of ``life``."""

    def __init__(self, life: Lifecycle, objects: Callable[[], ObjectStore | None]) -> None:
        self.life = life
        self.objects = objects

    async def _open(self, ctx: ToolContext, sandbox: str | None) -> Sandbox:
        return await self.life.open(ctx.namespace, ctx.session_id, sandbox, ctx.operation_id)

    async def find_command(
        self,
        ctx: ToolContext,
        command: str,
        sandbox: str | None = None,
        timeout_seconds: float = 600.0,
        idempotent: bool = False,
    ) -> Found | NotFound:
        sb = await self._open(ctx, sandbox)
        state = await _probe(sb, ctx.operation_id)
        if state.phase in (oplog.Phase.NONE, oplog.Phase.FENCED):
            return NotFound()  # it never started (a fenced one never will: a run says so)
        if state.phase is oplog.Phase.FINISHED:
            tail = await sb.read(f"{oplog.op_dir(ctx.operation_id)}/out", max(0, state.size - TAIL)) or b""
            return Found(oplog.outcome(state, tail.decode(errors="replace")))
        raise OutcomeUnknownError(f"command {ctx.operation_id} is {state.phase.value} with no handle kept")

    async def follow(
        self,
        ctx: ToolContext,
        command: str,
        sandbox: str | None = None,
        timeout_seconds: float = 600.0,
        idempotent: bool = False,
    ) -> dict[str, Any]:
        sb = await self._open(ctx, sandbox)
        handle = _handle(ctx)
        if (await _probe(sb, handle["op"])).phase is oplog.Phase.NONE:
            await _prepare(sb, handle["op"], command, timeout_seconds)  # the worker died before its start
        return await _Follower(sb, ctx, handle).run(command, timeout_seconds, idempotent)

    async def sandbox_exec(
        self,
        ctx: ToolContext,
        command: str,
        sandbox: str | None = None,
        timeout_seconds: float = 600.0,
        idempotent: bool = False,
    ) -> dict[str, Any]:
        """Run a shell command (sh -c) in the session's sandbox workspace (or the shared sandbox
        named by `sandbox`); returns its exit code and the end of its output. It is stopped after
        `timeout_seconds`. `idempotent`: running it again is harmless, so a run lost in a crash
        may be repeated."""
        if not command.strip():
            raise SchemaError("an empty command")
        sb = await self._open(ctx, sandbox)
        op = ctx.operation_id
        await _prepare(sb, op, command, timeout_seconds)
        handle = {"sandbox": sb.row.binding_id, "op": op, "run": 1, "base": ctx.output_offset}
        await ctx.keep_handle(json.dumps(handle))  # from here a crash re-attaches, never starts again
        await ctx.ensure_owner()  # the follower starts it: right before, this worker still holds it
        return await _Follower(sb, ctx, handle).run(command, timeout_seconds, idempotent)

    async def fs_upload(
        self,
        ctx: ToolContext,
        path: str,
        content: str,
        encoding: Literal["utf-8", "base64"] = "utf-8",
        sandbox: str | None = None,
    ) -> dict[str, Any]:
        """Write a file into the sandbox workspace (a relative path); `content` as text, or base64."""
        data = base64.b64decode(content, validate=True) if encoding == "base64" else content.encode()
        sb = await self._open(ctx, sandbox)
        await sb.write(user_path(path), data)
        return {"path": user_path(path), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    async def fs_download(
        self,
        ctx: ToolContext,
        path: str,
        encoding: Literal["utf-8", "base64"] = "utf-8",
        sandbox: str | None = None,
    ) -> dict[str, Any]:
        """Read a file of the sandbox workspace (at most 256 KiB; publish bigger ones as artifacts)."""
        sb = await self._open(ctx, sandbox)
        data = await sb.read(user_path(path), 0, INLINE_LIMIT + 1)
        if data is None:
            raise FileNotFoundError(f"{path} is not a file in the workspace")
        if len(data) > INLINE_LIMIT:
            raise SchemaError(f"{path} is over {INLINE_LIMIT} bytes: use artifact_publish")
        content = base64.b64encode(data).decode() if encoding == "base64" else data.decode(errors="replace")
        digest = hashlib.sha256(data).hexdigest()
        return {"path": user_path(path), "content": content, "bytes": len(data), "sha256": digest}

    async def artifact_publish(
        self, ctx: ToolContext, path: str, sandbox: str | None = None
    ) -> dict[str, Any]:
        """Put a workspace file into the object store; returns its verified reference."""
        store = self.objects()
        if store is None:
            raise NoObjectStoreError("no object store is configured (TENDON_S3_ENDPOINT_URL)")
        sb = await self._open(ctx, sandbox)
        data = await sb.read(user_path(path))
        if data is None:
            raise FileNotFoundError(f"{path} is not a file in the workspace")
        ref = await store.put(f"{ctx.namespace}/{ctx.session_id}", f"{ctx.operation_id}/artifact", data)
        return {"path": user_path(path), **ref.model_dump(mode="json")}


def sandbox_tools(route: str, life: Lifecycle, objects: Callable[[], ObjectStore | None]) -> list[Tool]:
    """The four tools of ``route``, working in the sandboxes of ``life``; ``objects``: the object
    store ``artifact_publish`` puts into (None: not configured)."""
    t = _Tools(life, objects)
    declared = tool(route=route, version="1", replay="unsafe", query=t.find_command)(t.sandbox_exec)
    exec_tool = Tool(declared.fn, declared.binding, declared.query, declared.args_model, reattach=t.follow)
    safe = [tool(route=route, version="1", replay="safe")(fn) for fn in (t.fs_upload, t.fs_download)]
    publish = tool(route=route, version="1", replay="safe")(t.artifact_publish)
    return [exec_tool, *safe, publish]
