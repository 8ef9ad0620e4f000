"""An MCP server for the tests, written with the official SDK's server side.

    python -m tests.mcp_server --log CALLS.jsonl [--gate FILE] [--http PORT]

Over stdio by default, or Streamable HTTP on ``--http PORT``. Every call appends a JSON line to
``--log`` (tool, operation id, pid), so a test counts what the server saw across restarts. The
tools that change something wait for ``--gate`` to exist when one is given, so a test can act
while the call is in flight. ``pay`` declares the Tendon durable extension: ``find_payment``
answers from the log (which outlives the process), ``cancel_payment`` stops a payment.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, ImageContent, TextContent, ToolAnnotations
from mcp_types import RequestParams
from pydantic import BaseModel

LOG = Path(os.devnull)
GATE: Path | None = None
TASKS_EXT = "io.modelcontextprotocol/tasks"
TASKS: dict[str, dict[str, Any]] = {}
ANSWERED: dict[str, asyncio.Event] = {}  # a task that asked for input was answered (or cancelled)


class TaskParams(RequestParams):
    taskId: str  # noqa: N815 - the wire's name


class UpdateParams(TaskParams):
    inputResponses: dict[str, Any]  # noqa: N815 - the wire's name


def _now() -> str:
    return datetime.now(UTC).isoformat()


class Tasks(Extension):
    """The Tasks extension (revision 2026-07-28) for ``render``: the call is answered with a task
    the server keeps in memory, finished in the background once the gate opens."""

    identifier = TASKS_EXT

    def methods(self) -> list[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskParams, self.get),
            MethodBinding("tasks/cancel", TaskParams, self.cancel),
            MethodBinding("tasks/update", UpdateParams, self.update),
        ]

    async def get(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        record(event="get", tool="tasks/get", op=params.taskId)
        return {"resultType": "complete", **TASKS[params.taskId]}

    async def cancel(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        record(event="task_cancelled", tool="tasks/cancel", op=params.taskId)
        task = TASKS[params.taskId]
        if task["status"] in ("working", "input_required"):
            task.update(status="cancelled", statusMessage="cancelled by the client", lastUpdatedAt=_now())
        ANSWERED.setdefault(params.taskId, asyncio.Event()).set()
        return {}

    async def update(self, ctx: Any, params: UpdateParams) -> dict[str, Any]:
        """The answers to a task's ``inputRequests`` (``refund`` asks for a confirmation)."""
        record(event="update", tool="tasks/update", op=params.taskId, responses=params.inputResponses)
        task = TASKS[params.taskId]
        if task["status"] == "input_required" and set(params.inputResponses) == set(task["inputRequests"]):
            answer = params.inputResponses["confirm"]
            task.pop("inputRequests")
            task.update(status="working", answer=answer, lastUpdatedAt=_now())
            ANSWERED.setdefault(params.taskId, asyncio.Event()).set()
        return {}

    async def intercept_tool_call(self, params: Any, ctx: Any, call_next: Any) -> Any:
        extensions = ((params.meta or {}).get("io.modelcontextprotocol/clientCapabilities") or {}).get(
            "extensions"
        )
        if params.name not in ("render", "refund") or TASKS_EXT not in (extensions or {}):
            return await call_next(ctx)
        task_id = f"task-{len(TASKS) + 1}-{os.getpid()}"
        TASKS[task_id] = {
            "taskId": task_id, "status": "working", "createdAt": _now(), "lastUpdatedAt": _now(),
            "ttlMs": None, "pollIntervalMs": 100,
        }  # fmt: skip
        arguments = params.arguments or {}
        op = (params.meta or {}).get("io.tendon/operation_id", "")
        record(event="call", tool=params.name, op=op, task=task_id)
        if params.name == "refund":
            work = self._refund(task_id, int(arguments.get("amount", 0)))
        else:
            work = self._work(task_id, int(arguments.get("pages", 0)))
        BACKGROUND.add(asyncio.get_running_loop().create_task(work))
        return {"resultType": "task", **TASKS[task_id]}

    async def _refund(self, task_id: str, amount: int) -> None:
        """Asks whether to refund (an elicitation, as the task's ``inputRequests``), then does
        what the answer says."""
        task = TASKS[task_id]
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
        asked = {
            "method": "elicitation/create",
            "params": {"message": f"Refund {amount} EUR?", "requestedSchema": schema},
        }
        task.update(status="input_required", inputRequests={"confirm": asked}, lastUpdatedAt=_now())
        await ANSWERED.setdefault(task_id, asyncio.Event()).wait()
        if task["status"] != "working":
            return
        answer = task["answer"]
        if answer.get("action") == "accept" and (answer.get("content") or {}).get("ok"):
            text, done = f"refunded {amount} EUR", {"refunded": amount}
        else:
            text, done = f"no refund: the person said {answer.get('action')}", {"refunded": 0}
        result = {"content": [{"type": "text", "text": text}], "structuredContent": done, "isError": False}
        task.update(status="completed", result=result, lastUpdatedAt=_now())

    async def _work(self, task_id: str, pages: int) -> None:
        await gate()
        task = TASKS[task_id]
        if task["status"] == "working":
            result = {"content": [{"type": "text", "text": f"rendered {pages} pages"}],
                      "structuredContent": {"pages": pages}, "isError": False}  # fmt: skip
            task.update(status="completed", result=result, lastUpdatedAt=_now())


BACKGROUND: set[asyncio.Task[None]] = set()
app = MCPServer("tendon-test", extensions=[Tasks()])


def record(**fields: Any) -> None:
    with LOG.open("a") as f:
        f.write(json.dumps({**fields, "pid": os.getpid()}) + "\n")


def records() -> list[dict[str, Any]]:
    return [json.loads(x) for x in LOG.read_text().splitlines() if x] if LOG.exists() else []


def operation(ctx: Context) -> str:
    return str((ctx.request_context.meta or {}).get("io.tendon/operation_id", ""))


async def gate(op: str = "") -> bool:
    """Wait for the gate; False if the operation was cancelled meanwhile."""
    while GATE is not None and not await anyio.Path(GATE).exists():
        if op and any(r["event"] == "cancelled" and r["op"] == op for r in records()):
            return False
        await anyio.sleep(0.05)
    return True


@app.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def lookup(key: str, ctx: Context) -> dict[str, Any]:
    """Look a key up (read-only)."""
    http = getattr(ctx.request_context, "request", None)  # the HTTP request, over Streamable HTTP
    api_key = http.headers.get("x-api-key") if http is not None else None
    record(event="call", tool="lookup", op=operation(ctx), api_key=api_key)
    await gate()
    return {"key": key, "value": key.upper()}


@app.tool(annotations=ToolAnnotations(idempotentHint=True))
async def charge(amount: int, ctx: Context) -> dict[str, Any]:
    """Charge an amount (changes the world, cannot be asked about)."""
    record(event="call", tool="charge", op=operation(ctx))
    await gate()
    return {"charged": amount}


@app.tool(meta={"io.tendon/durable": {"query": "find_payment", "cancel": "cancel_payment"}})
async def pay(amount: int, ctx: Context) -> dict[str, Any]:
    """Pay an amount; idempotent by operation id, can be asked about and cancelled."""
    op = operation(ctx)
    done = [r for r in records() if r["event"] == "paid" and r["op"] == op]
    if done:
        return dict(done[0]["result"])
    record(event="call", tool="pay", op=op)
    # A payment goes on when its caller goes away (a client that died), as a real one would.
    with anyio.CancelScope(shield=True):
        if not await gate(op):
            raise ToolError(f"payment {op} was cancelled")
        result = {"paid": amount, "receipt": f"r-{op[:8]}"}
        record(event="paid", tool="pay", op=op, result=result)
    return result


@app.tool(annotations=ToolAnnotations(readOnlyHint=True))
def find_payment(operation_id: str) -> dict[str, Any]:
    """Whether payment ``operation_id`` happened, and its result."""
    mine = [r for r in records() if r.get("op") == operation_id and r["tool"] == "pay"]
    paid = [r for r in mine if r["event"] == "paid"]
    if paid:
        return {"found": True, "result": paid[0]["result"]}
    if mine:
        raise ToolError(f"payment {operation_id} started and has not finished")
    return {"found": False}


@app.tool()
def cancel_payment(operation_id: str) -> dict[str, Any]:
    """Stop payment ``operation_id``."""
    record(event="cancelled", tool="cancel_payment", op=operation_id)
    return {"cancelled": operation_id}


@app.tool()
def decline(amount: int) -> str:
    """Always declines."""
    raise ToolError(f"card declined for {amount}")


@app.tool(annotations=ToolAnnotations(readOnlyHint=True))
def picture(caption: str) -> CallToolResult:
    """A caption and a one-pixel image, with structured content."""
    return CallToolResult(
        content=[
            TextContent(type="text", text=caption),
            ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png"),
        ],
        structured_content={"caption": caption, "pixels": 1},
    )


@app.tool()
def render(pages: int) -> str:
    """Render pages: a long job, answered with a task (the Tasks extension) to clients that can."""
    return f"rendered {pages} pages at once"


@app.tool()
def refund(amount: int) -> str:
    """Refund an amount once a person confirms it: a task that asks for input (the Tasks
    extension's ``input_required``) to clients that can answer."""
    return f"no refund of {amount}: this client cannot be asked to confirm"


async def charge_in(amount: int, currency: str, ctx: Context) -> dict[str, Any]:
    """Charge an amount in a currency (what ``charge`` becomes once ``reshape`` ran)."""
    record(event="call", tool="charge", op=operation(ctx), currency=currency)
    return {"charged": amount, "currency": currency}


def _reshape() -> None:
    app.remove_tool("charge")
    app.remove_tool("decline")
    app.add_tool(charge_in, name="charge", annotations=ToolAnnotations(idempotentHint=True))
    app.add_tool(lambda: "all refunded", name="refund_all", description="Refund everything.")


def _reshaped() -> Path:
    return LOG.with_name(LOG.name + ".reshaped")


@app.tool()
async def reshape(ctx: Context, tell: bool = True, keep: bool = False, refund_too: bool = False) -> str:
    """Change this server's tools while it runs: ``charge`` takes a currency from now on, ``decline``
    is gone, ``refund_all`` is new; then say so (the tools list-changed event), unless ``tell`` is
    false. ``keep``: a server started later (with the same log) starts reshaped. ``refund_too``:
    ``refund`` is listed anew as well (a new binding; its tasks go on)."""
    record(event="call", tool="reshape", op=operation(ctx))
    _reshape()
    if refund_too:
        app.remove_tool("refund")
        app.add_tool(refund, name="refund", description="Refund an amount, once a person confirms it.")
    if keep:
        _reshaped().touch()
    if not tell:
        return "reshaped quietly"
    await ctx.notify_tools_changed()  # 2026-07-28: on the client's subscriptions/listen stream
    with contextlib.suppress(Exception):  # before: the notification (which a 2026 session has not)
        await ctx.request_context.session.send_tool_list_changed()
    return "reshaped"


class GoOn(BaseModel):
    ok: bool


@app.tool()
async def ask_plainly(ctx: Context) -> str:
    """Asks its client a question in the middle of a plain call (an ``elicitation/create`` request,
    not a task's ``inputRequests``)."""
    record(event="call", tool="ask_plainly", op=operation(ctx))
    answer = await ctx.elicit("Go on?", GoOn)
    return f"the client said {answer.action}"


@app.tool()
async def sample_plainly(ctx: Context) -> str:
    """Asks its client's model for a message in the middle of a plain call (``sampling/createMessage``)."""
    from mcp.types import SamplingMessage

    said = SamplingMessage(role="user", content=TextContent(type="text", text="Say hi"))
    answer = await ctx.request_context.session.create_message(messages=[said], max_tokens=10)
    return str(answer.content)


@app.tool(annotations=ToolAnnotations(readOnlyHint=True))
def big(size: int) -> str:
    """A text of ``size`` bytes."""
    return "x" * size


def _exit_with_parent() -> None:
    """A stdio server whose Hands process was SIGKILLed must not outlive it."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.1)
    os._exit(0)


def pin(revision: str) -> None:
    """Make the server one of an older revision: it takes no 2026-07-28 request (so the client's
    probe fails and it falls back to the initialize handshake) and offers only ``revision``."""
    from mcp.server import runner

    runner._has_modern_envelope = lambda params: False  # type: ignore[attr-defined]
    runner.HANDSHAKE_PROTOCOL_VERSIONS = (revision,)  # type: ignore[attr-defined]
    runner.LATEST_HANDSHAKE_VERSION = revision  # type: ignore[attr-defined]


async def _no_listen(ctx: Any, params: Any) -> Any:
    """A ``subscriptions/listen`` this server refuses each time (``--listen-fails``)."""
    record(event="listen", tool="subscriptions/listen", op="")
    raise ToolError("this server's listen streams end at once")


def main() -> None:
    global LOG, GATE
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True)
    parser.add_argument("--gate", default=None)
    parser.add_argument("--http", type=int, default=None)
    parser.add_argument("--pin", default=None, help="serve only this handshake-era revision (2025-03-26...)")
    parser.add_argument("--listen-fails", action="store_true", help="refuse every subscriptions/listen")
    args = parser.parse_args()
    if args.pin:
        pin(args.pin)
    LOG, GATE = Path(args.log), Path(args.gate) if args.gate else None
    if _reshaped().exists():
        _reshape()
    if args.listen_fails:
        handlers = app._lowlevel_server._request_handlers  # noqa: SLF001 - a test server's fault
        handlers["subscriptions/listen"] = dataclasses.replace(
            handlers["subscriptions/listen"], handler=_no_listen
        )
    if args.http is None:
        threading.Thread(target=_exit_with_parent, daemon=True).start()
        app.run()
    else:
        app.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
