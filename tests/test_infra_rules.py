"""The rules of infra/, without servers: what a database can store, why a message was parked,
how long a passing fault is waited out, which transactions are tried again, what a lost connection
is, how often a repeated warning is written, how a command reports an error."""

from __future__ import annotations

import asyncio
import builtins
import gc
import os
import subprocess
import sys
import warnings
from typing import Any

import asyncpg
import pytest
from aio_pika import exceptions as amqp

from infra.db import TRANSACT_ATTEMPTS, is_transient, patiently, session_name, transact
from infra.db.sqlite import open_pool
from infra.liveness import new_worker_id
from infra.process.cli import ExitCodes, Fault, explained, reported
from infra.process.entry import run_async
from infra.process.heap import YOUNG_COLLECTION_EVERY, settle_heap
from infra.process.logging import Repeats
from infra.process.settings import http_address
from infra.transport import REASON_HEADER
from infra.transport.parked import reason_of
from protocol import ConflictError, NotFoundError, SchemaError, TransientError
from protocol.storable import storable, unstorable
from tests.support import REPO


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("fine", None),
        ({"a": [1, "two", {"b": None}]}, None),
        ("a\x00b", "NUL"),
        ({"k\x00": 1}, "NUL"),
        ([["deep", "x\x00"]], "NUL"),
        ("\ud800", "lone surrogate"),
        ({"text": "ok", "more": ["\udfff"]}, "lone surrogate"),
    ],
)
def test_unstorable_finds_what_postgresql_refuses_anywhere_in_a_json_value(value, problem):
    found = unstorable(value)
    assert (found is None) if problem is None else (problem in (found or ""))


def test_storable_escapes_what_postgresql_refuses_and_bounds_the_length():
    assert storable("a\x00b\ud800") == "a\\x00b\\ud800"
    assert unstorable(storable("x\x00" * 5000)) is None
    assert len(storable("y" * 5000)) == 2001


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({REASON_HEADER: "decode_error: not JSON"}, "decode_error: not JSON"),
        ({REASON_HEADER: b"as bytes"}, "as bytes"),
        (
            {"x-first-death-reason": "delivery_limit", "x-first-death-queue": "t.updates"},
            "delivered more times than the delivery limit allows without being settled (queue t.updates)",
        ),
        ({"x-first-death-reason": "rejected"}, "rejected by its consumer"),
        ({}, "no reason given"),
        (None, "no reason given"),
    ],
)
def test_a_parked_message_says_why_from_its_headers(headers, reason):
    assert reason_of(headers) == reason


async def test_patiently_waits_out_a_passing_fault_and_not_anything_else():
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionResetError("the database went away")
        return "done"

    assert await patiently(flaky, what="a test") == "done" and calls == 3

    async def broken() -> None:
        raise asyncpg.UniqueViolationError("a bug, not weather")

    with pytest.raises(asyncpg.UniqueViolationError):
        await patiently(broken, what="a test")


async def test_patiently_gives_up_after_its_patience_with_the_last_error():
    async def away() -> None:
        raise ConnectionRefusedError("still away")

    started = asyncio.get_running_loop().time()
    with pytest.raises(ConnectionRefusedError):
        await patiently(away, what="a test", patience=0.3)
    assert asyncio.get_running_loop().time() - started < 30  # it gave up: not forever


async def test_transact_tries_again_only_what_certainly_did_not_commit(tmp_path) -> None:
    pool = await open_pool(tmp_path / "t.sqlite3")
    try:
        calls: list[str] = []

        async def conflicted_twice(conn: object) -> str:
            calls.append("try")
            if len(calls) < 3:
                raise asyncpg.SerializationError("could not serialize access")
            return "committed"

        # A rolled-back transaction is tried again, as a whole
        assert await transact(pool, conflicted_twice) == "committed" and len(calls) == 3

        async def duplicate(conn: object) -> None:
            calls.append("dup")
            raise asyncpg.UniqueViolationError("duplicate key")

        # A unique violation is a bug, or (for an idempotent submit) a race to try again once
        calls.clear()
        with pytest.raises(asyncpg.UniqueViolationError):
            await transact(pool, duplicate)
        assert calls == ["dup"]
        calls.clear()
        with pytest.raises(asyncpg.UniqueViolationError):
            await transact(pool, duplicate, read_then_insert=True)
        assert calls == ["dup"] * TRANSACT_ATTEMPTS
    finally:
        await pool.close()


async def test_a_server_waits_for_a_service_not_there_yet_but_not_for_one_that_refuses_it() -> None:
    from aiormq.exceptions import AMQPConnectionError, ProbableAuthenticationError

    from infra.process.startup import not_there_yet, wait_for, where

    # Not there yet: refused, unresolvable, starting up, answering 5xx (an object store)
    for exc in (ConnectionRefusedError(), OSError("Name or service not known"), TimeoutError(),
                asyncpg.CannotConnectNowError("the database system is starting up"),
                AMQPConnectionError("refused"), TransientError("object store unavailable")):  # fmt: skip
        assert not_there_yet(exc), exc
    # Refusing us: a wrong password, a role that does not exist, a bug
    for exc in (ProbableAuthenticationError("ACCESS_REFUSED"),
                asyncpg.InvalidAuthorizationSpecificationError("role does not exist"),
                asyncpg.InvalidPasswordError("password authentication failed"), ValueError()):  # fmt: skip
        assert not not_there_yet(exc), exc
    # The log line names where, never the credentials
    assert where("postgresql://tendon:secret@db.internal:5432/tendon") == "db.internal:5432"
    assert where("http://minio:9000") == "minio:9000"

    calls = 0

    async def up_on_the_third_try() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionRefusedError("not yet")
        return "connected"

    assert await wait_for(up_on_the_third_try, service="PostgreSQL", url="postgresql://h:1/d") == "connected"

    async def refused() -> None:
        raise asyncpg.InvalidPasswordError("password authentication failed")

    with pytest.raises(asyncpg.InvalidPasswordError):  # at once, with no patience spent
        await asyncio.wait_for(wait_for(refused, service="PostgreSQL", url="postgresql://h:1/d"), 5)

    async def away() -> None:
        raise ConnectionRefusedError("still away")

    started = asyncio.get_running_loop().time()
    # Given up on: the service and its address named (an OSError names neither), the error kept
    with pytest.raises(TransientError) as gone:
        await wait_for(away, service="RabbitMQ", url="amqp://guest:secret@h:1/", patience=0.5)
    assert asyncio.get_running_loop().time() - started < 5
    assert gone.value.message == "cannot reach RabbitMQ at h:1: ConnectionRefusedError: still away"
    assert isinstance(gone.value.__cause__, ConnectionRefusedError)
    assert explained(gone.value) == (Fault.UNAVAILABLE, gone.value.message)


def test_the_http_address_is_host_and_port_or_off() -> None:
    assert [http_address(v) for v in ("off", " OFF ", "", "none")] == [None] * 4
    assert http_address("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert http_address("[::1]:0") == ("::1", 0)
    for bad in ("8080", "localhost", "host:", ":80", "host:port", "host:65536", "host:-1"):
        with pytest.raises(SchemaError):
            http_address(bad)


def test_settling_the_heap_freezes_what_lives_now_and_spaces_the_young_collections() -> None:
    before = gc.get_threshold()
    try:
        frozen = settle_heap()
        assert frozen > 10_000  # this process's modules, at least
        assert not gc.get_objects(generation=2)  # all of it left the collector's walks
        assert gc.get_threshold() == (YOUNG_COLLECTION_EVERY, *before[1:])
        later = [0]
        assert any(o is later for o in gc.get_objects(generation=0))  # new objects are collected as before
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_a_ctrl_c_that_pydantic_reports_as_a_schema_error_is_taken_for_what_it_is() -> None:
    import pydantic_core

    from infra.process.entry import interrupted

    # What a Ctrl-C landing while pydantic-core builds a serializer (as modules load) raises
    disguised = pydantic_core.SchemaError(
        "Error building `default` serializer:\nSchemaError: Error building `literal` serializer:\n"
        "KeyboardInterrupt: "
    )
    assert interrupted(disguised)
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise RuntimeError("while loading") from exc
    except RuntimeError as chained:
        assert interrupted(chained)
    assert not interrupted(pydantic_core.SchemaError("Error building `literal` serializer: bad value"))
    assert not interrupted(ValueError("KeyboardInterrupt is only a word here"))


def test_a_span_when_not_tracing_is_nothing_and_attaches_no_context(monkeypatch) -> None:
    from opentelemetry import context, trace

    from infra.process.tracing import Tracing

    def attach(*_: object) -> None:
        raise AssertionError("a context was attached while not tracing")

    monkeypatch.setattr(context, "attach", attach)
    tracing = Tracing(None)
    with tracing.span("model call", {"tendon.turn_id": "turn-1"}, turn="turn-1") as span:
        assert span is trace.INVALID_SPAN and trace.get_current_span() is trace.INVALID_SPAN
        assert tracing.carried(span) is None  # nothing goes to the Hands
    with tracing.span("execute t", {}, traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01") as span:
        assert span is trace.INVALID_SPAN


def test_a_span_when_tracing_is_the_child_of_its_turn_or_of_the_span_its_envelope_names() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from infra.process.tracing import Tracing, turn_ids

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider)
    with tracing.span("model call", {"tendon.turn_id": "turn-1"}, turn="turn-1") as call:
        carried = tracing.carried(call)
    with tracing.span("execute t", {}, traceparent=carried):
        pass
    with tracing.span("execute t", {}):  # a re-run after a crash: a trace of its own
        pass
    made, ran, rerun = exporter.get_finished_spans()
    trace_id, span_id = turn_ids("turn-1")
    assert (made.context.trace_id, made.parent.span_id) == (trace_id, span_id)
    assert made.attributes["tendon.turn_id"] == "turn-1"
    assert (ran.context.trace_id, ran.parent.span_id) == (trace_id, made.context.span_id)
    assert rerun.parent is None and rerun.context.trace_id != trace_id


def test_a_ctrl_c_before_the_loop_starts_leaves_no_coroutine_unawaited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a Ctrl-C that lands while the event loop's library loads
    real_import = builtins.__import__

    def interrupted_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "uvloop":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    async def command() -> None:
        pass

    monkeypatch.setattr(builtins, "__import__", interrupted_import)
    main = command()
    # When a command's coroutine is handed to run_async
    with warnings.catch_warnings(record=True) as seen, pytest.raises(KeyboardInterrupt):
        warnings.simplefilter("always")
        run_async(main)
    monkeypatch.undo()
    # Then the interrupt goes on, and the coroutine was closed: no "never awaited" warning
    del main
    gc.collect()
    assert [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)] == []


def test_a_repeated_warning_is_written_once_a_period_and_the_next_says_how_many_were_held_back() -> None:
    now = [0.0]
    repeats = Repeats(every=5.0, clock=lambda: now[0])
    written = []
    for tick in range(60):  # a line of each of two kinds every 0.25 s for 15 s
        now[0] = tick * 0.25
        for kind in (("claim_failed",), ("repair_scan_error",)):
            if (held := repeats.admit(kind)) is not None:
                written.append((now[0], kind[0], held))
    assert written == [
        (0.0, "claim_failed", 0), (0.0, "repair_scan_error", 0),
        (5.0, "claim_failed", 19), (5.0, "repair_scan_error", 19),
        (10.0, "claim_failed", 19), (10.0, "repair_scan_error", 19),
    ]  # fmt: skip


def test_a_session_the_server_ended_is_a_lost_connection_and_a_bug_is_not() -> None:
    # asyncpg's refusal of a connection the server's last message left waiting (see
    # tests/test_db_ended_sessions.py for the real thing), against its errors that are bugs
    assert is_transient(
        asyncpg.InternalClientError("cannot switch to state 12; another operation (2) is in progress")
    )
    assert not is_transient(asyncpg.InternalClientError("no binary format encoder for type x (OID 1)"))


# ---- how a command reports an error (infra.process.cli) -----------------------------------


@pytest.mark.parametrize(
    ("error", "fault", "said"),
    [
        (ConflictError("request id 'r' was used with another input"), Fault.CONFLICT,
         "CONFLICT: request id 'r' was used with another input"),
        (NotFoundError("no turn t-1"), Fault.USAGE, "no turn t-1"),
        (TransientError("the database is briefly away"), Fault.UNAVAILABLE, "the database is briefly away"),
        (ConnectionRefusedError(111, "Connect call failed"), Fault.UNAVAILABLE,
         "cannot reach a service: ConnectionRefusedError: [Errno 111] Connect call failed"),
        (asyncpg.PostgresConnectionError("gone"), Fault.UNAVAILABLE,
         "cannot reach the database: PostgresConnectionError: gone"),
        (asyncpg.InterfaceError("connection is closed"), Fault.UNAVAILABLE,
         "cannot reach the database: InterfaceError: connection is closed"),
        (amqp.AMQPConnectionError("down"), Fault.UNAVAILABLE,
         "cannot reach the broker: AMQPConnectionError: down"),
        (amqp.ProbableAuthenticationError("ACCESS_REFUSED"), Fault.UNAVAILABLE,
         "the broker refused the login: ACCESS_REFUSED"),
        (amqp.ChannelClosed(404, "NOT_FOUND"), Fault.UNAVAILABLE,
         "the broker refused the request: ChannelClosed"),
        (asyncpg.InvalidAuthorizationSpecificationError("role x"), Fault.UNAVAILABLE,
         "the database refused the login: role x"),
        (asyncpg.CannotConnectNowError("starting up"), Fault.UNAVAILABLE,
         "the database refused the request: CannotConnectNowError: starting up"),
        (asyncpg.UniqueViolationError("dup"), Fault.USAGE,
         "the database refused the request: UniqueViolationError: dup"),
        (asyncpg.InvalidTextRepresentationError("bad"), Fault.USAGE, "the database refused the request"),
    ],
)  # fmt: skip
def test_an_error_that_is_no_bug_is_told_as_one_line_of_its_kind(error, fault, said) -> None:
    explanation = explained(error)
    assert explanation is not None
    assert explanation[0] is fault and explanation[1].startswith(said)


def test_a_bug_is_not_explained_and_keeps_its_traceback(capsys) -> None:
    def buggy() -> int:
        raise ValueError("a bug")

    assert explained(ValueError("a bug")) is None
    with pytest.raises(ValueError, match="a bug"):
        reported("brain", buggy, ExitCodes(conflict=4, usage=2, unavailable=5))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("error", "brain", "hands"),
    [
        (ConflictError("c"), 4, 2),
        (NotFoundError("n"), 2, 2),
        (TransientError("t"), 5, 2),
        (ConnectionResetError("r"), 5, 2),
        (BrokenPipeError("a connection's, stdout is fine"), 5, 2),
        (asyncpg.UniqueViolationError("dup"), 2, 2),
        (asyncpg.CannotConnectNowError("starting up"), 5, 2),
    ],
)
def test_each_command_gives_each_kind_of_error_its_own_exit_code(capsys, error, brain, hands) -> None:
    def failing() -> int:
        raise error

    assert reported("brain", failing, ExitCodes(conflict=4, usage=2, unavailable=5)) == brain
    assert reported("hands", failing, ExitCodes(conflict=2, usage=2, unavailable=2)) == hands
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2 and said[0].startswith("brain: ") and said[1].startswith("hands: ")


def test_a_reported_error_is_one_line_even_with_a_detail_and_ctrl_c_is_130(capsys) -> None:
    codes = ExitCodes(conflict=4, usage=2, unavailable=5)

    def detailed() -> int:
        raise NotFoundError("no such thing\nDETAIL:  it was never there")

    def interrupted_by_the_user() -> int:
        raise KeyboardInterrupt

    assert reported("brain", detailed, codes) == 2
    assert capsys.readouterr().err == "brain: no such thing DETAIL: it was never there\n"
    assert reported("brain", interrupted_by_the_user, codes) == 130
    assert reported("brain", lambda: 3, codes) == 3


def test_a_workers_sessions_bear_its_whole_id_within_postgresqls_63_bytes(monkeypatch) -> None:
    # Given a host whose name is as long as a name may be (a pod's, a cloud machine's)
    monkeypatch.setattr("socket.gethostname", lambda: "h" * 253)
    ids = {new_worker_id("hands") for _ in range(50)}
    # Then each worker id is cut to fit, still its own, and its sessions' name is it whole
    assert len(ids) == 50
    for worker_id in ids:
        assert worker_id.startswith("hands-hhh") and len(worker_id.encode()) <= 56
        assert session_name(worker_id) == "tendon:" + worker_id
    # And an id given from elsewhere, too long or not ASCII, is cut and told apart by a digest
    long_ids = ["w" * 80 + "-1", "w" * 80 + "-2", "wörker-" + "x" * 70]
    names = [session_name(w) for w in long_ids]
    assert len(set(names)) == 3
    assert all(len(n.encode()) <= 63 and n.isascii() and n.startswith("tendon:") for n in names)


def test_a_verb_whose_output_is_closed_says_so_and_blames_no_service(tmp_path) -> None:
    # Given a verb that prints more than a pipe holds, piped into a reader that stops after a line
    (tmp_path / "verbose_verb.py").write_text(
        "from infra.process.cli import ExitCodes, reported\n"
        "def main():\n"
        "    def lines():\n"
        "        for _ in range(100_000):\n"
        "            print('x' * 80)\n"
        "        return 0\n"
        "    return reported('brain', lines, ExitCodes(conflict=4, usage=2, unavailable=5))\n"
    )
    run = "import sys; from infra.process.entry import run; sys.exit(run('brain', 'verbose_verb'))"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", run], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    # Then it stops with one line saying why and SIGPIPE's exit code (a service's is 5)
    assert proc.wait(60) == 141
    assert err.splitlines() == ["brain: stopped: the output was closed (broken pipe)"]
