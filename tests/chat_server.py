"""A local HTTP server that speaks the chat-completions wire format, for tests of the model adapter.

Each request's JSON body goes to a policy, which answers with what the "model" does this time:
a reply (streamed as server-sent events when the request asks for a stream, else one JSON
object), an HTTP error with headers (429 with Retry-After, 500...), a connection dropped in
the middle of a stream, or a reply that is not valid JSON. Real sockets, the real ``openai``
client on the other side: nothing is mocked.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """What the model says: text, and/or tool calls as (name, raw arguments) pairs."""

    content: str | None = None
    tool_calls: list[tuple[str, str]] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=lambda: {"prompt_tokens": 11, "completion_tokens": 7})
    call_ids: list[str] | None = None  # the ids the API gives its calls (default call_<n>)
    delay: float = 0.0  # before the first byte


@dataclass
class Status:
    """An HTTP error answer."""

    code: int
    headers: dict[str, str] = field(default_factory=dict)
    message: str = "error"


@dataclass
class Drop:
    """Start a streamed reply, then close the connection before it ends (``hold``: seconds to keep
    it open first, the pieces sent, as a model that is slow to go on)."""

    content: str = "Let me think"
    hold: float = 0.0


@dataclass
class Malformed:
    """A 200 whose body (or first stream event) is not valid JSON."""


Answer = Reply | Status | Drop | Malformed
Policy = Callable[[dict[str, Any]], Answer]


def _completion(reply: Reply, model: str) -> dict[str, Any]:
    ids = reply.call_ids or [f"call_{i}" for i in range(len(reply.tool_calls))]
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": ids[i], "type": "function", "function": {"name": name, "arguments": args}}
            for i, (name, args) in enumerate(reply.tool_calls)
        ]
    usage = {**reply.usage, "total_tokens": sum(reply.usage.values())}
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if reply.tool_calls else "stop"}
        ],
        "usage": usage,
    }


def _chunks(reply: Reply, model: str) -> list[dict[str, Any]]:
    """The reply as stream chunks: text in pieces, each call's arguments in two pieces, usage last."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    out = [chunk({"role": "assistant", "content": ""})]
    text = reply.content or ""
    for i in range(0, len(text), 8):
        out.append(chunk({"content": text[i : i + 8]}))
    ids = reply.call_ids or [f"call_{i}" for i in range(len(reply.tool_calls))]
    for i, (name, args) in enumerate(reply.tool_calls):
        half = len(args) // 2
        out.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": ids[i],
                            "type": "function",
                            "function": {"name": name, "arguments": args[:half]},
                        }
                    ]
                }
            )
        )
        out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": args[half:]}}]}))
    out.append(chunk({}, "tool_calls" if reply.tool_calls else "stop"))
    usage = {**reply.usage, "total_tokens": sum(reply.usage.values())}
    out.append({**chunk({}), "choices": [], "usage": usage})
    return out


class ChatServer:
    """``with ChatServer(policy) as server:`` serves on a free loopback port; ``server.url`` is the
    base URL (``.../v1``), ``server.requests`` every request body received, in order."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # a streamed body ends when the connection closes

            def log_message(self, *_: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                with outer._lock:
                    outer.requests.append(body)
                answer = outer.policy(body)
                try:
                    outer._answer(self, body, answer)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up first (a test of its timeout)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> ChatServer:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, handler: BaseHTTPRequestHandler, body: dict[str, Any], answer: Answer) -> None:
        model = str(body.get("model", "test-model"))
        stream = bool(body.get("stream"))
        if isinstance(answer, Status):
            data = json.dumps(
                {"error": {"message": answer.message, "type": "test", "code": answer.code}}
            ).encode()
            handler.send_response(answer.code)
            for k, v in answer.headers.items():
                handler.send_header(k, v)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
            return
        if isinstance(answer, Reply) and answer.delay:
            time.sleep(answer.delay)
        handler.send_response(200)
        if not stream:
            data = (
                b"{not json"
                if isinstance(answer, Malformed)
                else json.dumps(_completion(answer, model)).encode()
            )  # type: ignore[arg-type]
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
            return
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        if isinstance(answer, Malformed):
            handler.wfile.write(b"data: {not json\n\n")
            handler.wfile.flush()
            return
        if isinstance(answer, Drop):
            first = _chunks(Reply(content=answer.content), model)[:2]
            for c in first:
                handler.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
            handler.wfile.flush()
            time.sleep(answer.hold)
            handler.close_connection = True
            handler.connection.shutdown(2)  # gone mid-stream, without the end of the reply
            return
        for c in _chunks(answer, model):
            handler.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
            handler.wfile.flush()
        handler.wfile.write(b"data: [DONE]\n\n")
        handler.wfile.flush()


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool messages of a request, their content parsed."""
    return [
        {"tool_call_id": m["tool_call_id"], **json.loads(m["content"])}
        for m in body.get("messages", [])
        if m.get("role") == "tool"
    ]
