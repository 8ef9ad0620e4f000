"""A chat-completions server that streams a long reply and says when it sent the first token.

For the time-to-first-token scenario: every request is answered with ``tokens`` streamed chunks
of one word each, and the wall-clock time (``time.time()``, the same clock every process on this
machine reads) at which the first chunk with text was flushed is kept under the request's last
user message, so that a reader that knows which input it sent can subtract it from the time the
token reached it, whichever process the request came from.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "bench-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


class StreamingModel:
    """``with StreamingModel(tokens) as model:`` serves on a free loopback port (``model.url``);
    ``model.first_sent[text]``: when the first token of the answer to ``text`` left."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.first_sent: dict[str, float] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # a streamed body ends when the connection closes

            def log_message(self, *_: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                key = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                out = self.wfile
                out.write(_chunk({"role": "assistant", "content": ""}))
                out.write(_chunk({"content": "token"}))
                out.flush()
                outer.first_sent.setdefault(key, time.time())
                for _ in range(outer.tokens - 1):
                    out.write(_chunk({"content": " token"}))
                out.write(_chunk({}, "stop"))
                n = outer.tokens
                usage = {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": n + 10}
                out.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
                out.write(b"data: [DONE]\n\n")
                out.flush()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> StreamingModel:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
