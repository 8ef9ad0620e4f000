"""Bad input over HTTP: every route of the API answers it with a clear 4xx in the one error shape
(``{"error": {"code", "message"}}``), and the Brain serves on as before.

A table of nasty inputs (``cases``), made for every route the app has (a new route is in it at
once; one with a body fails here until its fields are listed in ``BODIES``): path ids and query
values with a NUL, another control character or 10,000 characters; numbers where ``isdigit`` is
true and ``int`` fails (``²``); bodies with NaN, Infinity, ``1e999``, an integer past 2^53, a
duplicate key, a lone surrogate, invalid UTF-8, nesting past the recursion limit, an id of
10,000 characters or one with a NUL, and bodies over the size limit (413); a ``Last-Event-ID``
of ``²``; an unknown route, a method a route does not take. What a route may take (an odd but
valid session id, a long input) must at least not be a 5xx, and any refusal has the error shape.

The table runs on the app in this process over each backend (the embedded SQLite store and
PostgreSQL), and against served Brains (`brain serve --local`, and `brain serve` on PostgreSQL)
through their HTTP server, with the size limit tested on the wire: a ``Content-Length`` over it
is refused before the body is sent, and a chunked body is refused once it passed the limit,
long before the client would have sent all of it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from brain.api import Api, Tokens, hash_token
from brain.api.app import create_app
from brain.api.guard import BodyLimit
from brain.store import BrainStore, open_brain_store, open_store
from infra.db.sqlite import open_pool
from infra.transport import Topology
from infra.transport.localqueue import LocalBroker
from tests.support import Processes, TendonEnv, free_port
from tests.test_console import local_server

TOKEN, OPERATOR = "token-of-ns", "token-of-the-operator"
SESSION = "s-fuzz"
LIMIT = 256 * 1024  # the size limit of the app in this process (bytes)
AGENT = {
    "name": "fuzz-agent",
    "version": "1",
    "tools": [],
    "model": {"kind": "scripted", "script": [{"content": "hi"}], "temperature": 0.5},
}

LG_INPUT = {"messages": [{"role": "user", "content": "go"}]}
# Ids: refused wherever an id goes (path parameters, request ids, agent names...).
BAD_IDS = {
    "nul": "a\x00b",
    "escape": "a\x1bb",
    "newline": "a\nb",
    "c1": "a\x85b",
    "10k": "x" * 10_000,
}
# Odd but valid text: a route may take it (a session id ``²``), but never with a 5xx.
ODD = {"superscript": "²", "replacement": "\ufffd", "nan": "NaN", "1e999": "1e999", "5000 digits": "9" * 5000}
# JSON values no field takes: refused in any body (strict JSON, or no value of the field's kind).
BAD_VALUES = {
    "NaN": "NaN",
    "Infinity": "Infinity",
    "-Infinity": "-Infinity",
    "1e999": "1e999",
    "2^64": "18446744073709551616",
    "nul": '"a\\u0000b"',
    "lone surrogate": '"a\\ud800b"',
    "duplicate key": '{"a": 1, "a": 2}',
}
# JSON values an id field refuses, beyond those.
BAD_ID_VALUES = {"10k": json.dumps("x" * 10_000), "escape": '"a\\u001bb"', "newline": '"a\\nb"'}
LAST_EVENT_IDS = ["²", "٣", "-1", "1e3", "0x10", "1 2", "9" * 30, "9" * 5000, "\x85"]


@dataclass(frozen=True)
class Field:
    """A field of a body: where it is, and whether it is an id (which refuses 10,000 characters)."""

    path: tuple[str, ...]
    is_id: bool = False


@dataclass(frozen=True)
class Body:
    good: Callable[[Ids], dict[str, Any]]
    fields: list[Field]


@dataclass(frozen=True)
class Ids:
    """The ids a seeded Brain has: its session, a turn of it (and an execution id, a console file)."""

    turn: str

    def of(self, name: str) -> str:
        known = {"session_id": SESSION, "turn_id": self.turn, "execution_id": "exec-none", "name": "app.js"}
        langgraph = {"thread_id": SESSION, "run_id": "run-none", "assistant_id": "asst-none",
                     "cron_id": "sch-none", "checkpoint_id": "1", "what": "graph"}  # fmt: skip
        return {**known, **langgraph, "schedule_id": "sch-none", "action": "pause"}[name]


# Every route that takes a body, by method and path: its good body and the fields to spoil.
BODIES: dict[tuple[str, str], Body] = {
    ("POST", "/v1/sessions/{session_id}/turns"): Body(
        lambda ids: {"request_id": "r-good", "input": "go", "agent": AGENT, "thread": "main"},
        [
            Field(("request_id",), is_id=True),
            Field(("thread",), is_id=True),
            Field(("input",)),
            Field(("agent", "name"), is_id=True),
            Field(("agent", "version"), is_id=True),
            Field(("agent", "instructions")),
            Field(("agent", "model", "temperature")),
        ],
    ),
    ("POST", "/v1/turns/{turn_id}/controls"): Body(
        lambda ids: {"kind": "steer", "text": "hi", "request_id": "c-good"},
        [Field(("request_id",), is_id=True), Field(("text",)), Field(("revision",)), Field(("control_id",))],
    ),
    ("POST", "/v1/turns/{turn_id}/respond"): Body(
        lambda ids: {"call": "call-1", "decision": "result", "result": {"ok": 1}, "request_id": "x-good"},
        [
            Field(("call",), is_id=True),
            Field(("request_id",), is_id=True),
            Field(("result",)),
            Field(("result", "ok")),
            Field(("reason",)),
        ],
    ),
    ("POST", "/v1/turns/{turn_id}/signals"): Body(
        lambda ids: {"key": "x.ready", "payload": {"ok": 1}, "request_id": "g-good"},
        [
            Field(("key",), is_id=True),
            Field(("payload",)),
            Field(("payload", "ok")),
            Field(("request_id",), is_id=True),
        ],
    ),
    ("POST", "/v1/schedules"): Body(
        lambda ids: {
            "request_id": "h-good",
            "session": SESSION,
            "agent": AGENT,
            "input": "go",
            "delay": 3600,
        },
        [
            Field(("request_id",), is_id=True),
            Field(("session",), is_id=True),
            Field(("thread",), is_id=True),
            Field(("input",)),
            Field(("cron",)),
            Field(("delay",)),
            Field(("agent", "name"), is_id=True),
        ],
    ),
    ("POST", "/langgraph/assistants"): Body(
        lambda ids: {"graph_id": AGENT["name"], "context": {"agent": AGENT}, "if_exists": "do_nothing"},
        [
            Field(("graph_id",), is_id=True),
            Field(("context", "agent", "version"), is_id=True),
            Field(("context", "agent", "instructions")),
            Field(("if_exists",)),
        ],
    ),
    **{
        ("POST", path): Body(
            lambda ids: {"assistant_id": AGENT["name"], "input": LG_INPUT, "multitask_strategy": "enqueue"},
            [
                Field(("assistant_id",), is_id=True),
                Field(("multitask_strategy",)),
                Field(("stream_mode",)),
                Field(("after_seconds",)),
                Field(("webhook",)),
            ],
        )
        for path in (
            "/langgraph/threads/{thread_id}/runs",
            "/langgraph/threads/{thread_id}/runs/stream",
            "/langgraph/threads/{thread_id}/runs/wait",
            "/langgraph/runs",
            "/langgraph/runs/stream",
            "/langgraph/runs/wait",
        )
    },  # fmt: skip
    ("POST", "/langgraph/threads/{thread_id}/runs/crons"): Body(
        lambda ids: {"assistant_id": AGENT["name"], "input": LG_INPUT, "schedule": "0 0 1 1 *"},
        [Field(("assistant_id",), is_id=True), Field(("schedule",)), Field(("timezone",))],
    ),
    ("POST", "/v1/operator/executions/{execution_id}/reconcile"): Body(
        lambda ids: {"evidence": "a log", "actor": "me", "result": 1, "request_id": "q-good"},
        [
            Field(("evidence",)),
            Field(("actor",)),
            Field(("result",)),
            Field(("failure",)),
            Field(("request_id",), is_id=True),
        ],
    ),
}


@dataclass(frozen=True)
class Case:
    label: str
    method: str
    path: str
    refused: bool  # must be a 4xx (else: must not be a 5xx)
    params: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str | bytes] = field(default_factory=dict)
    content: bytes | None = None
    status: int | None = None  # the status it must have, when one is known


def _with(body: dict[str, Any], where: tuple[str, ...], raw: str) -> bytes:
    """``body`` as JSON text with the value at ``where`` replaced by the raw JSON text ``raw``."""
    marker = "@@spoiled@@"
    spoiled = json.loads(json.dumps(body))
    node = spoiled
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = marker
    return json.dumps(spoiled).replace(json.dumps(marker), raw).encode()


def _api_routes(routes: list[Any]) -> list[APIRoute]:
    found: list[APIRoute] = []
    for route in routes:
        if isinstance(route, APIRoute):
            found.append(route)
        inner = getattr(route, "original_router", None)  # FastAPI 0.165 keeps an included router whole
        if inner is not None:
            found += _api_routes(inner.routes)
    return found


def _routes(app: FastAPI) -> list[tuple[str, APIRoute]]:
    return [(method, r) for r in _api_routes(app.routes) for method in sorted(r.methods)]


def _query_names(app: FastAPI, route: APIRoute, method: str) -> list[str]:
    doc = app.openapi()["paths"].get(route.path, {}).get(method.lower(), {})
    documented = [p["name"] for p in doc.get("parameters", []) if p["in"] == "query"]
    return documented or [p.name for p in route.dependant.query_params]


def cases(app: FastAPI, ids: Ids, limit: int) -> list[Case]:
    """The nasty requests for every route of ``app``, with the seeded ``ids``."""
    made: list[Case] = []
    for method, route in _routes(app):
        names = list(route.param_convertors)  # the submit declares none: it reads its own

        def path(
            spoil: str | None = None, value: str = "", names: list[str] = names, route: APIRoute = route
        ) -> str:
            given = {n: quote(value if n == spoil else ids.of(n), safe="") for n in names}
            return re.sub(r":\w+\}", "}", route.path).format(**given)  # {thread_id:path}: a path's id

        name = f"{method} {route.path}"
        body = BODIES.get((method, route.path))
        good = json.dumps(body.good(ids)).encode() if body else None
        streams = route.path.endswith("/stream")
        # a stream that opens never ends, and a run's wait lasts as long as its run: only refusals
        waits = streams or route.path.endswith("/wait")
        for spoil in names:
            for label, value in BAD_IDS.items():
                made.append(Case(f"{name} {spoil}={label}", method, path(spoil, value), True, content=good))
            for label, value in ODD.items():
                if not waits:
                    made.append(
                        Case(f"{name} {spoil}={label}", method, path(spoil, value), False, content=good)
                    )
        for query in _query_names(app, route, method):
            for label, value in BAD_IDS.items():
                made.append(
                    Case(f"{name} ?{query}={label}", method, path(), True, {query: value}, content=good)
                )
            for label, value in ODD.items():
                if not waits:
                    made.append(
                        Case(f"{name} ?{query}={label}", method, path(), False, {query: value}, content=good)
                    )
        # Any route: a control character in a query value it does not even read, a body over the limit
        made.append(Case(f"{name} ?junk=nul", method, path(), True, {"junk": "a\x00b"}, content=good))
        made.append(
            Case(
                f"{name} 1 byte over the limit", method, path(), True, content=b"x" * (limit + 1), status=413
            )
        )
        if streams:
            for value in LAST_EVENT_IDS:
                # A header is read as Latin-1: "²" is the byte 0xB2 (a UTF-8 client's "٣" arrives
                # as its two bytes)
                sent = (
                    value.encode("latin-1")
                    if value.isascii() or len(value) == 1 and ord(value) < 256
                    else value.encode()
                )
                headers = {"Last-Event-ID": sent}
                made.append(
                    Case(f"{name} Last-Event-ID {value[:8]!r}", method, path(), True, headers=headers)
                )
        if body is not None:
            made += _body_cases(name, method, path(), body, ids, limit)
    return made


def _body_cases(name: str, method: str, path: str, body: Body, ids: Ids, limit: int) -> list[Case]:
    good = body.good(ids)
    raw = json.dumps(good).encode()
    json_type = {"content-type": "application/json"}
    made = [
        Case(f"{name} body {label}", method, path, True, headers=json_type, content=content)
        for label, content in {
            "empty": b"",
            "null": b"null",
            "a list": b"[]",
            "a string": b'"go"',
            "two values": raw + b" {}",
            "not UTF-8": raw[:-1] + b', "x": "\xff\xfe"}',
            "nested past the recursion limit": b"[" * 100_000 + b"]" * 100_000,
            "a duplicate key": raw[:-1] + b", " + raw[1:],
            "not JSON": b"request_id=r1",
        }.items()
    ]
    # A declared body refuses it (422); the submit reads its body as JSON whatever its type.
    made.append(
        Case(f"{name} body as text/plain", method, path, False, {}, {"content-type": "text/plain"}, raw)
    )
    padding = {**good, "padding": "x" * limit}
    made.append(
        Case(
            f"{name} body over the limit",
            method,
            path,
            True,
            content=json.dumps(padding).encode(),
            status=413,
        )
    )
    for f in body.fields:
        spoilers = {**BAD_VALUES, **(BAD_ID_VALUES if f.is_id else {})}
        for label, token in spoilers.items():
            where = ".".join(f.path)
            made.append(
                Case(
                    f"{name} {where}={label}",
                    method,
                    path,
                    True,
                    headers=json_type,
                    content=_with(good, f.path, token),
                )
            )
        if not f.is_id:
            long = json.dumps("x" * 10_000)
            made.append(
                Case(
                    f"{name} {'.'.join(f.path)}=10k",
                    method,
                    path,
                    False,
                    headers=json_type,
                    content=_with(good, f.path, long),
                )
            )
    return made


def framework_cases(ids: Ids) -> list[Case]:
    """What FastAPI and Starlette answer themselves: an unknown route, a method a route does not take."""
    return [
        Case("an unknown route", "GET", "/v1/nothing-here", True, status=404),
        Case("an unknown long route", "GET", "/v1/" + "x" * 10_000, True, status=404),
        Case("an unknown route with a NUL", "GET", "/v1/a%00b", True, status=404),
        Case("a method the route does not take", "DELETE", f"/v1/turns/{ids.turn}", True, status=405),
        Case("a method the route does not take", "PUT", f"/v1/sessions/{SESSION}/turns", True, status=405),
    ]


def assert_error_shape(answer: httpx.Response, case: Case) -> None:
    try:
        said = answer.json()
    except ValueError:
        raise AssertionError(
            f"{case.label}: {answer.status_code} is not JSON: {answer.text[:300]!r}"
        ) from None
    assert isinstance(said, dict) and set(said) == {"error"}, f"{case.label}: {said!r:.300}"
    error = said["error"]
    assert isinstance(error, dict) and set(error) == {"code", "message"}, f"{case.label}: {said!r:.300}"
    assert isinstance(error["code"], str) and isinstance(error["message"], str), (
        f"{case.label}: {said!r:.300}"
    )
    assert error["code"] and error["message"], f"{case.label}: {said!r:.300}"


def token_for(path: str) -> str:
    return OPERATOR if path.startswith(("/v1/operator", "/metrics")) else TOKEN


async def send(http: httpx.AsyncClient, case: Case) -> httpx.Response:
    headers: dict[str, str | bytes] = {"Authorization": f"Bearer {token_for(case.path)}", **case.headers}
    request = http.build_request(
        case.method, case.path, params=case.params, headers=headers, content=case.content
    )
    # A request that is accepted where it should have been refused may wait (a stream): bounded.
    return await asyncio.wait_for(http.send(request), 30)


async def check_all(http: httpx.AsyncClient, all_cases: list[Case]) -> list[str]:
    """Send every case; what went wrong, one line each (empty: all answered as they must)."""
    wrong: list[str] = []
    for case in all_cases:
        try:
            answer = await send(http, case)
        except TimeoutError:
            wrong.append(f"{case.label}: no answer within 30 s")
            continue
        except httpx.TransportError as exc:
            wrong.append(f"{case.label}: no answer: {exc!r}")
            continue
        status = answer.status_code
        if status >= 500 or (case.refused and not 400 <= status < 500):
            wrong.append(f"{case.label}: {status} {answer.text[:200]!r}")
            continue
        if case.status is not None and status != case.status:
            wrong.append(f"{case.label}: {status}, not {case.status}: {answer.text[:200]!r}")
            continue
        if status >= 400:
            try:
                assert_error_shape(answer, case)
            except AssertionError as exc:
                wrong.append(str(exc))
    return wrong


async def still_serves(http: httpx.AsyncClient, request_id: str) -> None:
    """The Brain takes and answers a good request after all that."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    body = {"request_id": request_id, "input": "still there?", "agent": AGENT}
    answer = await http.post(f"/v1/sessions/{SESSION}/turns", json=body, headers=auth)
    assert answer.status_code == 201, answer.text
    turn = (await http.get(f"/v1/turns/{answer.json()['turn_id']}", headers=auth)).json()
    assert turn["turn_id"] == answer.json()["turn_id"], turn
    assert (await http.get(f"/v1/sessions/{SESSION}/turns", headers=auth)).status_code == 200


async def seed(http: httpx.AsyncClient) -> Ids:
    body = {"request_id": "r-seed", "input": "go", "agent": AGENT}
    answer = await http.post(
        f"/v1/sessions/{SESSION}/turns", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert answer.status_code == 201, answer.text
    return Ids(turn=answer.json()["turn_id"])


# ---- the app in this process, on each backend ----------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> TendonEnv | None:
    """A world on PostgreSQL, or None for the embedded store (which needs no services)."""
    return request.getfixturevalue("tendon") if request.param == "postgres" else None


@pytest.fixture
async def app_http(
    backend: TendonEnv | None, tmp_path: Path
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The API over the embedded store or PostgreSQL (a local queue as its transport), in this
    process, with a size limit of ``LIMIT``."""
    if backend is not None:
        store: BrainStore = await open_store(backend.settings())
    else:
        store = await open_brain_store(await open_pool(tmp_path / "brain.sqlite3"))
    async with LocalBroker(tmp_path / "queue.sqlite3", Topology("t-input")) as broker:
        tokens = Tokens(f"ns:{hash_token(TOKEN)}", hash_token(OPERATOR), "ns")
        api = Api(
            store=store, tokens=tokens, topology=broker.topology, wake_channel="wake", transport=broker,
            max_request_bytes=LIMIT,
        )  # fmt: skip
        app = create_app(api)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://brain"
        ) as http:
            yield app, http
    await store.close()


async def test_every_route_answers_nasty_input_with_a_4xx_in_the_one_error_shape(
    app_http: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    app, http = app_http
    # Given a session with a turn
    ids = await seed(http)
    # When every route gets every nasty input of the table
    table = cases(app, ids, LIMIT) + framework_cases(ids)
    assert len(table) > 500 and {c.path.split("?")[0] for c in table}
    wrong = await check_all(http, table)
    # Then each is answered as it must be, with the error shape
    assert not wrong, f"{len(wrong)} of {len(table)} wrong:\n" + "\n".join(wrong[:60])
    # And the Brain serves on
    await still_serves(http, "r-after")


def test_the_table_covers_every_route_and_every_body() -> None:
    # A route added later is in the table at once; one with a body must say which fields it has
    app = routes_app()
    table = cases(app, Ids(turn="turn-1"), LIMIT)
    routes = {(m, r.path) for m, r in _routes(app)}
    covered = {(c.method, _template(app, c)) for c in table}
    assert routes - covered == set(), routes - covered
    doc = app.openapi()["paths"]
    with_body = {
        (m, r.path) for m, r in _routes(app) if "requestBody" in doc.get(r.path, {}).get(m.lower(), {})
    }
    assert with_body == set(BODIES), with_body ^ set(BODIES)


def _template(app: FastAPI, case: Case) -> str:
    for _, route in _routes(app):
        match, _ = route.matches({"type": "http", "path": _unquoted(case.path), "method": case.method})
        if match.name == "FULL":
            return route.path
    return case.path


def _unquoted(path: str) -> str:
    from urllib.parse import unquote

    return unquote(path)


# ---- the size limit, in the middleware ------------------------------------------------------


class Exchange:
    """One request through :class:`BodyLimit`: a body that keeps coming (chunks of 64 KiB, as many
    as ``chunks``, or forever), what was pulled of it, what the app saw, what was answered."""

    def __init__(self, headers: list[tuple[bytes, bytes]], chunks: int | None = None) -> None:
        self.scope = {"type": "http", "method": "POST", "path": "/v1/x", "headers": headers}
        self.chunks, self.pulled, self.reached = chunks, 0, False
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        self.pulled += 1
        more = self.chunks is None or self.pulled < self.chunks
        return {"type": "http.request", "body": b"x" * 65536, "more_body": more}

    async def app(self, scope: Any, receive: Any, send: Any) -> None:
        self.reached = True

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    async def run(self, limit: int) -> tuple[int, dict[str, Any], dict[bytes, bytes]]:
        await BodyLimit(self.app, limit=limit)(self.scope, self.receive, self.send)
        said = json.loads(b"".join(m.get("body", b"") for m in self.sent[1:]))
        return self.sent[0]["status"], said, dict(self.sent[0]["headers"])


async def test_a_body_past_the_limit_is_refused_and_never_kept_nor_read_past_twice_the_limit() -> None:
    # Given a body that keeps coming, in chunks of 64 KiB, with no Content-Length, and a limit of 1 MiB
    forever = Exchange([(b"transfer-encoding", b"chunked")])
    status, said, headers = await forever.run(1024 * 1024)
    # Then it is refused in the error shape, the app never ran, and no more than twice the limit
    # was read (the first MiB counted, the second dropped for the answer to be heard), and the
    # connection is closed on the rest
    assert (status, said["error"]["code"], forever.reached) == (413, "too_large", False)
    assert "at most 1,048,576 bytes" in said["error"]["message"]
    assert forever.pulled == 33 and headers[b"connection"] == b"close"
    # And a body that ends soon after the limit is read to its end and answered on a live connection
    soon = Exchange([(b"transfer-encoding", b"chunked")], chunks=20)
    status, said, headers = await soon.run(1024 * 1024)
    assert (status, soon.pulled, soon.reached) == (413, 20, False) and b"connection" not in headers


async def test_a_content_length_past_the_limit_is_refused_before_a_byte_is_kept() -> None:
    for length, status, pulled in (
        (b"52428800", 413, 0),  # 50 MB: answered at once, nothing read
        (b"1200000", 413, 19),  # a little over: its body read and dropped, the answer heard
        (b"\xc2\xb2", 400, 0),  # "²"
        (b"-1", 400, 0),
        (b"1" * 40, 400, 0),
    ):
        exchange = Exchange([(b"content-length", length)], chunks=19)
        answered, said, _ = await exchange.run(1024 * 1024)
        assert (answered, exchange.pulled, exchange.reached) == (status, pulled, False), length
        assert set(said["error"]) == {"code", "message"}
    # A client that waits for "100 Continue" is answered without being asked for its body
    waits = Exchange([(b"content-length", b"1200000"), (b"expect", b"100-continue")])
    assert (await waits.run(1024 * 1024))[0] == 413 and waits.pulled == 0


# ---- served Brains, through their HTTP server ---------------------------------------------------

SERVED_LIMIT = 1024 * 1024


async def raw_exchange(
    port: int, head: bytes, body_chunks: AsyncIterator[bytes] | None = None
) -> tuple[int, bytes, int]:
    """Send ``head``, then the chunks (chunked-encoded) until an answer comes, on a socket of its
    own; (status, answer body, bytes of body sent before the answer). A plain socket: what the
    server sent before it closed is read even when the close was a reset (asyncio's streams would
    raise the reset instead)."""
    loop = asyncio.get_running_loop()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setblocking(False)
    sent = 0

    async def sending() -> None:
        nonlocal sent
        if body_chunks is None:
            return
        async for chunk in body_chunks:
            await loop.sock_sendall(sock, f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            sent += len(chunk)

    try:
        await loop.sock_sendall(sock, head)
        sender = asyncio.ensure_future(sending())
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                more = await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), 10)
                if not more:
                    break
                data += more
            sender.cancel()
            head_end = data.index(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: *([0-9]+)", data[:head_end]).group(1))  # type: ignore[union-attr]
            while len(data) < head_end + 4 + length:
                more = await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), 10)
                if not more:
                    break
                data += more
        finally:
            sender.cancel()
            with contextlib.suppress(BaseException):
                await sender
        return int(data.split(b" ", 2)[1]), data[head_end + 4 : head_end + 4 + length], sent
    finally:
        sock.close()


async def fifty_megabytes() -> AsyncIterator[bytes]:
    for _ in range(50 * 16):
        yield b"x" * 65536
        await asyncio.sleep(0)


async def check_served(port: int) -> None:
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        ids = await seed(http)
        table = cases(routes_app(), ids, SERVED_LIMIT) + framework_cases(ids)
        wrong = await check_all(http, table)
        assert not wrong, f"{len(wrong)} of {len(table)} wrong:\n" + "\n".join(wrong[:80])

        # A Content-Length of 50 MB: refused before the body is sent
        path = f"/v1/sessions/{SESSION}/turns"
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {50 * 1024 * 1024}\r\n\r\n"
        ).encode()
        status, body, _ = await raw_exchange(port, head)
        assert status == 413 and json.loads(body)["error"]["code"] == "too_large", body

        # 50 MB sent in chunks: refused once past the limit, long before the client sent it all
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        ).encode()
        status, body, sent = await raw_exchange(port, head, fifty_megabytes())
        assert status == 413, (status, body, sent)
        assert json.loads(body)["error"]["code"] == "too_large", (status, body, sent)
        assert sent < 20 * 1024 * 1024, sent

        await still_serves(http, "r-after")


def routes_app() -> FastAPI:
    """An app with the routes of this checkout (a served Brain's too), to make the table from."""
    api = Api(store=None, tokens=Tokens("", "", "ns"), topology=Topology("t"), wake_channel="w")  # type: ignore[arg-type]
    return create_app(api)


SERVED_ENV = {
    "TENDON_API_TOKENS": f"ns:{hash_token(TOKEN)}",
    "TENDON_OPERATOR_TOKENS": hash_token(OPERATOR),
    "TENDON_MAX_REQUEST_BYTES": str(SERVED_LIMIT),
    "TENDON_DRAIN_SECONDS": "0",
}


async def test_a_local_server_refuses_nasty_input_and_big_bodies_and_serves_on(
    processes: Processes, tmp_path: Path
) -> None:
    port = free_port()
    await local_server(processes, tmp_path, ["tests.brain_e2e_tools"], port, SERVED_ENV)
    await check_served(port)


async def test_a_brain_on_postgresql_refuses_nasty_input_and_big_bodies_and_serves_on(
    tendon: TendonEnv, processes: Processes
) -> None:
    port = free_port()
    env = {**tendon.env, **SERVED_ENV, "TENDON_HTTP": f"127.0.0.1:{port}"}
    await processes.start_ready("brain", ["-m", "brain", "serve"], env)
    await check_served(port)
