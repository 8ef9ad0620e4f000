"""A small mailbox HTTP service that plays "the external system" in examples and tests.

It accepts messages idempotently (one delivery per ``Idempotency-Key``), can be asked
whether it saw an operation (``GET /messages/by-key/<key>``), and counts every POST
attempt per key so a test can prove a tool was never re-sent blindly. Stdlib only.

    python -m examples.mailbox --port 8025 [--host 127.0.0.1] [--no-lookup] [--state FILE] [--delay S]

Endpoints:

- ``POST /messages`` with header ``Idempotency-Key`` and JSON ``{"to", "subject", "body"}``:
  201 and a new receipt the first time a key is seen, 200 and the *same* receipt (no new
  delivery) afterwards; 400 with ``{"error": ...}`` without a key or with a bad body.
- ``GET /messages/by-key/<key>``: 200 with the receipt, 404 ``{"error": "not found"}``;
  503 ``{"error": "lookup not supported"}`` when started with ``--no-lookup`` (a service
  that cannot be queried, which is what makes an execution UNKNOWN).
- ``GET /stats``: ``{"deliveries": [receipts in order], "posts_per_key": {key: count}}``.

With ``--state FILE`` the state is loaded at start and rewritten atomically after every
change, so it survives restarts. With ``--delay S`` a POST is answered S seconds after its message
was stored, as a slow provider would: a sender that dies meanwhile leaves a message the mailbox
has and its sender never heard of (the chaos run's kills land there).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["MailboxServer", "MailboxState", "main"]

_BY_KEY_PREFIX = "/messages/by-key/"
_MAX_BODY = 1 << 20


class MailboxState:
    """Deliveries, receipts by idempotency key and POST attempts per key; thread-safe."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self._lock = threading.Lock()
        self._path = Path(path) if path is not None else None
        self.deliveries: list[dict[str, Any]] = []
        self.posts_per_key: dict[str, int] = {}
        self._by_key: dict[str, dict[str, Any]] = {}
        if self._path is not None and self._path.exists():
            self._load(self._path)

    def _load(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            deliveries = list(data["deliveries"])
            posts = {str(k): int(v) for k, v in dict(data["posts_per_key"]).items()}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RuntimeError(f"mailbox state file {path} is unreadable: {exc}") from exc
        self.deliveries = deliveries
        self.posts_per_key = posts
        self._by_key = {r["idempotency_key"]: r for r in deliveries}

    def _save(self) -> None:
        """Write the state atomically (temp file, fsync, rename). Call with the lock held."""
        if self._path is None:
            return
        directory = self._path.parent
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self._path.name}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self._snapshot(), f, indent=2, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def _snapshot(self) -> dict[str, Any]:
        return {
            "deliveries": [dict(r) for r in self.deliveries],
            "posts_per_key": dict(self.posts_per_key),
        }

    def count_post(self, key: str) -> None:
        """Count one POST attempt for ``key`` (whether or not it is valid or new)."""
        with self._lock:
            self.posts_per_key[key] = self.posts_per_key.get(key, 0) + 1
            self._save()

    def accept(self, key: str, to: str) -> tuple[dict[str, Any], bool]:
        """Record a delivery for ``key`` unless one exists; returns (receipt, created)."""
        with self._lock:
            existing = self._by_key.get(key)
            if existing is not None:
                return dict(existing), False
            receipt = {
                "message_id": f"msg-{len(self.deliveries) + 1}",
                "idempotency_key": key,
                "to": to,
                "accepted_at": datetime.now(UTC).isoformat(),
            }
            self.deliveries.append(receipt)
            self._by_key[key] = receipt
            self._save()
            return dict(receipt), True

    def lookup(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            receipt = self._by_key.get(key)
            return dict(receipt) if receipt is not None else None

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return self._snapshot()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        state: MailboxState,
        lookup: bool,
        on_accepted: Callable[[int], None] | None = None,
        delay: float = 0.0,
    ) -> None:
        self.state = state
        self.lookup = lookup
        self.on_accepted = on_accepted
        self.delay = delay
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    server_version = "TendonMailbox/1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        return None

    def _reply(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        path = urlsplit(self.path).path
        if path == "/stats":
            self._reply(200, self.server.state.stats())
        elif path.startswith(_BY_KEY_PREFIX):
            if not self.server.lookup:
                self._reply(503, {"error": "lookup not supported"})
                return
            key = unquote(path[len(_BY_KEY_PREFIX) :])
            receipt = self.server.state.lookup(key) if key else None
            if receipt is None:
                self._reply(404, {"error": "not found"})
            else:
                self._reply(200, receipt)
        else:
            self._reply(404, {"error": "no such endpoint"})

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        if urlsplit(self.path).path != "/messages":
            self._reply(404, {"error": "no such endpoint"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > _MAX_BODY:
            self._reply(400, {"error": "bad Content-Length"})
            return
        raw = self.rfile.read(length) if length else b""
        key = (self.headers.get("Idempotency-Key") or "").strip()
        if not key:
            self._reply(400, {"error": "missing Idempotency-Key header"})
            return
        state = self.server.state
        state.count_post(key)
        try:
            body = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            self._reply(400, {"error": "body is not valid JSON"})
            return
        if not isinstance(body, dict):
            self._reply(400, {"error": "body must be a JSON object"})
            return
        missing = [f for f in ("to", "subject", "body") if not isinstance(body.get(f), str)]
        if missing:
            self._reply(400, {"error": f"missing or non-string fields: {', '.join(missing)}"})
            return
        receipt, created = state.accept(key, body["to"])
        if created and self.server.on_accepted is not None:
            self.server.on_accepted(len(state.stats()["deliveries"]))
        if self.server.delay:
            time.sleep(self.server.delay)  # this request's own thread
        self._reply(201 if created else 200, receipt)


class MailboxServer:
    """The mailbox run in-process: ``start()`` serves in a thread, ``stop()`` ends it.

    ``port=0`` picks a free port; ``url`` gives the real address once started.
    Usable as a context manager.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        lookup: bool = True,
        state_path: str | os.PathLike[str] | None = None,
        on_accepted: Callable[[int], None] | None = None,
        delay: float = 0.0,
    ) -> None:
        self.host = host
        self.port = port
        self.lookup = lookup
        self.delay = delay
        self.state_path = state_path
        # Called with the number of deliveries once a new one is stored, before it is answered
        # (the demo's crash: the service has the email, its sender never hears so).
        self.on_accepted = on_accepted
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def bind(self) -> None:
        """Load the state and bind the socket (without serving yet)."""
        if self._httpd is not None:
            return
        state = MailboxState(self.state_path)
        self._httpd = _HTTPServer((self.host, self.port), state, self.lookup, self.on_accepted, self.delay)
        self.port = self._httpd.server_address[1]

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("mailbox is not started")
        return f"http://{self.host}:{self.port}"

    def stats(self) -> dict[str, Any]:
        """The same as ``GET /stats``, without HTTP."""
        if self._httpd is None:
            raise RuntimeError("mailbox is not started")
        return self._httpd.state.stats()

    def start(self) -> MailboxServer:
        self.bind()
        assert self._httpd is not None
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"mailbox-{self.port}",
                daemon=True,
            )
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until interrupted (used by the command line)."""
        self.bind()
        assert self._httpd is not None
        try:
            self._httpd.serve_forever(poll_interval=0.1)
        finally:
            self._httpd.server_close()
            self._httpd = None

    def stop(self) -> None:
        httpd, thread = self._httpd, self._thread
        self._httpd, self._thread = None, None
        if httpd is None:
            return
        if thread is not None:
            httpd.shutdown()
            thread.join(timeout=5)
        httpd.server_close()

    def __enter__(self) -> MailboxServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.mailbox", description="A small idempotent mailbox service."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="0 picks a free port")
    parser.add_argument(
        "--no-lookup",
        action="store_true",
        help="answer 503 to GET /messages/by-key/<key> (a service that cannot be queried)",
    )
    parser.add_argument("--state", default=None, help="JSON file to persist state across restarts")
    parser.add_argument(
        "--delay", type=float, default=0.0, help="seconds between storing a message and answering its POST"
    )
    args = parser.parse_args(argv)

    server = MailboxServer(
        args.host, args.port, lookup=not args.no_lookup, state_path=args.state, delay=args.delay
    )
    server.bind()
    signal.signal(signal.SIGTERM, _on_sigterm)
    print(f"mailbox listening on {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
