"""What every request passes before a route acts on it: its size, its ids, its body as strict JSON.

- **Size** (:class:`BodyLimit`, around the whole app): a body is read here, at most
  ``TENDON_MAX_REQUEST_BYTES`` of it. A ``Content-Length`` over the limit is refused (413)
  before a byte of the body is kept; a body sent without one (chunked) is counted as it comes,
  and refused (413) once it passed the limit. So no request holds more than the limit in memory,
  however big it says it is or turns out to be. (The rest of a body refused that is not much over
  the limit, up to twice the limit in all, is read and dropped, so that the client hears the 413:
  a connection closed on a body it still sends may lose the answer. One far over is closed.)
- **Ids** (:class:`CheckedRoute`, every route of the API): each path parameter is an id as
  ``brain.rules.names`` says (no control character, no lone surrogate, at most its length), and
  no query value holds a control character: refused (422) before anything is looked up.
- **Strict JSON** (:class:`StrictRequest`): a body is read by the one codec (``protocol.codec``:
  no NaN or Infinity, no number a double cannot hold, no duplicate key, one value), never by the
  standard library's lax parser; what it refuses is a ``decode_error`` (422).

Every refusal has the one error shape, ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from brain.rules.names import MAX_ID, MAX_SESSION_ID, check_id, shown, unprintable
from protocol import DecodeError, SchemaError, TooLargeError, loads

DEFAULT_MAX_REQUEST_BYTES = 10 * 1024 * 1024
DROP_SECONDS = 5.0  # how long the rest of a body refused for its size is read and dropped at most
# The query parameters that name an id (their values are checked as ids, not only as text).
ID_QUERIES = {"turn": "turn id"}


def error_response(
    code: str, message: str, status: int, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


class BodyLimit:
    """ASGI middleware: a request's body is at most ``limit`` bytes (else 413), read before the app
    runs and handed to it as it came."""

    def __init__(self, app: ASGIApp, limit: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared, expects = None, False
        for name, value in scope["headers"]:
            if name == b"content-length":
                text = value.decode("latin-1").strip()
                if not (text.isascii() and text.isdigit()) or len(text) > 30:
                    bad = error_response("bad_request", f"Content-Length {shown(text)} is not a number", 400)
                    await bad(scope, receive, send)
                    return
                declared = int(text)
            elif name == b"expect":
                expects = value.strip().lower() == b"100-continue"
        if declared is not None and declared > self.limit:
            # A client that waits for "100 Continue" never sends it; one that sends it anyway has
            # it read and dropped when it is not much over (else its connection is closed).
            drop = not expects and declared <= 2 * self.limit
            await self._too_large(f"{declared:,} bytes", drop, 0, scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away before its body ended
                await self.app(scope, _replay([], message, receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._too_large(f"more than {self.limit:,} bytes", True, size, scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(chunks, None, receive), send)

    async def _too_large(
        self, size: str, drop: bool, read: int, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Answer 413. With ``drop``, the rest of the body (``read`` bytes of it were read) is first
        read and dropped, up to twice the limit in all (a few seconds at most): the client then hears
        the answer, where a connection closed on a body it still sends could lose it. A body longer
        still closes the connection."""
        ended = await _dropped(receive, 2 * self.limit - read) if drop else False
        message = (
            f"the request body is {size}: this server takes at most {self.limit:,} bytes "
            "(TENDON_MAX_REQUEST_BYTES)"
        )
        headers = None if ended else {"Connection": "close"}
        await error_response(TooLargeError.code, message, 413, headers)(scope, receive, send)


async def _dropped(receive: Receive, most: int) -> bool:
    """Read and drop what is left of a body, ``most`` bytes at most; whether it ended."""
    dropped = 0
    try:
        async with asyncio.timeout(DROP_SECONDS):
            while dropped <= most:
                message = await receive()
                if message["type"] != "http.request":
                    return False
                dropped += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return True
    except TimeoutError:
        pass
    return False


def _replay(chunks: list[bytes], ended: Message | None, receive: Receive) -> Receive:
    """A ``receive`` that gives the body read already as one message (or the disconnect that cut
    it), then whatever the connection says next (a disconnect, to a stream that waits for one)."""
    pending: list[Message] = [
        ended if ended is not None else {"type": "http.request", "body": b"".join(chunks), "more_body": False}
    ]

    async def replayed() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replayed


class StrictRequest(Request):
    """A request whose JSON body is read by the one strict codec (``protocol.codec.loads``), once."""

    _strict: Any

    async def json(self) -> Any:
        if not hasattr(self, "_strict"):
            try:
                self._strict = loads(await self.body())
            except DecodeError as exc:
                raise DecodeError(f"body: {exc.message}") from None
        return self._strict


def check_ids(request: Request) -> None:
    """Refuse (SchemaError) a path parameter that is no id, or a query value that holds a control
    character, naming which."""
    for name, value in request.path_params.items():
        if isinstance(value, str):
            limit = MAX_SESSION_ID if name == "session_id" else MAX_ID
            check_id(name.replace("_", " "), value, limit)
    for name, value in request.query_params.multi_items():
        if name in ID_QUERIES:
            check_id(ID_QUERIES[name], value, MAX_ID)
            continue
        problem = unprintable(value) or unprintable(name)
        if problem is not None:
            raise SchemaError(f"query parameter {shown(name)} {problem}")


class CheckedRoute(APIRoute):
    """A route whose ids are checked first (:func:`check_ids`) and whose body is strict JSON
    (:class:`StrictRequest`). A declared body is decoded before FastAPI reads it, so that what the
    codec refuses is its ``decode_error``, not FastAPI's "error parsing the body"; a route that
    reads its own (the submit) decodes it when it asks (``await request.json()``)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        declared = self.body_field is not None

        async def checked(request: Request) -> Response:
            check_ids(request)
            strict = StrictRequest(request.scope, request.receive)
            if declared and await strict.body():
                await strict.json()
            return await handler(strict)

        return checked
