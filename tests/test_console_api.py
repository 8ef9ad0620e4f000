"""What the console reads, through the public API any client has: the caller's sessions (newest
first, searched, a page at a time) with their latest turn's input, agent and times; a turn's tool
calls with their arguments, worker and output as it came; for operators the UNKNOWN executions
and the routes with the workers that serve each now. The reads on both backends, the routes in
this process on the embedded store (no servers)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from brain import verbs
from brain.api import Api, Tokens, hash_token
from brain.api.app import create_app
from brain.store import BrainStore, open_brain_store
from brain.verbs import browse
from brain.verbs.describe import describe
from infra.db.sqlite import open_pool
from infra.transport import Topology
from infra.transport.localqueue import LocalBroker
from protocol import (
    AcceptedBody,
    AcceptedEvent,
    NotFoundError,
    OutputPageBody,
    OutputPageEvent,
    ReplayPolicy,
    SchemaError,
    StartedBody,
    StartedEvent,
    SucceededBody,
    SucceededEvent,
    ToolBinding,
    UnknownBody,
    UnknownEvent,
)
from tests.test_brain_store import _agent, _apply, _header, _submit, _waiting_on, store

__all__ = ["store"]  # the fixture, used by name


async def _session(store: BrainStore, session: str, request: str, agent: str, namespace: str = "ns") -> str:
    turn_id, _ = await verbs.submit(
        store, namespace=namespace, session_id=session, request_id=request, user_input=f"input of {session}",
        agent=_agent(name=agent), wake_channel="wake",
    )  # fmt: skip
    return turn_id


async def test_sessions_are_listed_newest_first_a_page_at_a_time_searched_and_kept_to_their_namespace(
    store: BrainStore,
) -> None:
    # Given five sessions of one namespace (their agents and request ids differ) and one of another
    for n in range(5):
        await _session(store, f"s-{n}", f"req-{n}", "mailer" if n % 2 else "greeter")
    await _session(store, "s-other", "req-x", "mailer", namespace="other")
    # When they are listed two at a time
    pages, after = [], None
    while True:
        page = await browse.sessions(store, namespace="ns", limit=2, after=after)
        pages.append([s["id"] for s in page["sessions"]])
        after = page["next"]
        if after is None:
            break
    # Then every one is there once, newest first, and no other namespace's
    assert pages == [["s-4", "s-3"], ["s-2", "s-1"], ["s-0"]]
    first = (await browse.sessions(store, namespace="ns", limit=1))["sessions"][0]
    assert (first["turns"], first["unfinished"]) == (1, 1)
    last = first["last_turn"]
    assert (last["input"], last["agent_name"], last["status"], last["thread"]) == (
        "input of s-4", "greeter", "queued", "main",
    )  # fmt: skip
    assert last["created_at"] is not None and last["updated_at"] is not None
    # And a search finds a part of the id, an agent's name or a request id, in any case
    for search, found in (("S-3", ["s-3"]), ("mail", ["s-3", "s-1"]), ("req-2", ["s-2"]), ("%", [])):
        page = await browse.sessions(store, namespace="ns", search=search)
        assert [s["id"] for s in page["sessions"]] == found, search
    # And text no store can hold is refused as such, not sent to the database
    with pytest.raises(SchemaError, match="search cannot be looked for"):
        await browse.sessions(store, namespace="ns", search="a\x00b")
    with pytest.raises(NotFoundError):
        await browse.output(store, namespace="ns", execution_id="e\x00")


async def test_a_turns_list_shows_each_turns_input_and_agent(store: BrainStore) -> None:
    await _submit(store, "r1", "first words")
    await _submit(store, "r2", "second words")
    turns = await verbs.turns(store, namespace="ns", session_id="s1")
    assert [(t["input"], t["agent_name"], t["agent_version"]) for t in turns] == [
        ("first words", "a", "1"),
        ("second words", "a", "1"),
    ]


async def test_a_tool_calls_arguments_worker_and_output_are_read_as_its_events_said(
    store: BrainStore,
) -> None:
    # Given a turn waiting on one call, whose Hands worker wrote output as it ran
    turn_id = await _submit(store)
    await _waiting_on(store, turn_id, "e1")
    h = _header("e1")
    await _apply(store, [AcceptedEvent(seq=1, body=AcceptedBody(worker="hands-1"), **h)])
    await _apply(store, [StartedEvent(seq=2, body=StartedBody(attempt=1, worker="hands-2"), **h)])
    await _apply(store, [OutputPageEvent(seq=3, body=OutputPageBody(offset=0, data="héllo\n"), **h)])
    # Then its description names the worker that started it and the arguments the model gave
    (call,) = (await describe(store, "ns", turn_id))["executions"]
    assert (call["worker"], call["attempts"], call["args"], call["status"]) == ("hands-2", 1, {}, "running")
    # And its output reads from any byte offset, the page after it starting where that one ended
    out = await browse.output(store, namespace="ns", execution_id="e1")
    assert (out["pages"], out["next"]) == ([{"offset": 0, "data": "héllo\n"}], 7)
    await _apply(store, [OutputPageEvent(seq=4, body=OutputPageBody(offset=7, data="bye"), **h)])
    assert (await browse.output(store, namespace="ns", execution_id="e1", offset=7))["pages"] == [
        {"offset": 7, "data": "bye"}
    ]
    # And an UNKNOWN one is listed for operators with why, from every namespace
    await _apply(store, [UnknownEvent(seq=5, body=UnknownBody(reason="its worker died"), **h)])
    (unknown,) = await browse.unknown(store)
    assert {k: unknown[k] for k in ("id", "namespace", "session_id", "turn_id", "worker", "reason")} == {
        "id": "e1", "namespace": "ns", "session_id": "s1", "turn_id": turn_id, "worker": "hands-2",
        "reason": "its worker died",
    }  # fmt: skip
    done = SucceededEvent(seq=6, body=SucceededBody(result=1, how="reconciled", evidence="a log"), **h)
    await _apply(store, [done])
    assert await browse.unknown(store) == []


# ---- the routes, in this process ----------------------------------------------------------

TOKENS = {"ns": "token-of-ns", "other": "token-of-other"}
OPERATOR = "token-of-the-operator"


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[tuple[BrainStore, httpx.AsyncClient]]:
    """The embedded store, and a client of an API over it whose transport is a local queue."""
    store = await open_brain_store(await open_pool(tmp_path / "brain.sqlite3"))
    async with LocalBroker(tmp_path / "queue.sqlite3", Topology("t-console")) as broker:
        tokens = Tokens(
            ",".join(f"{n}:{hash_token(t)}" for n, t in TOKENS.items()), hash_token(OPERATOR), "ns"
        )
        api = Api(store=store, tokens=tokens, topology=broker.topology, wake_channel="wake", transport=broker)
        transport = httpx.ASGITransport(app=create_app(api))
        async with httpx.AsyncClient(transport=transport, base_url="http://brain") as http:
            http.broker = broker  # type: ignore[attr-defined]  # the test starts consumers on it
            yield store, http
    await store.close()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_the_sessions_route_lists_the_callers_sessions_only(local: Any) -> None:
    store, http = local
    await _session(store, "mine", "r", "greeter")
    await _session(store, "theirs", "r", "greeter", namespace="other")
    answer = (await http.get("/v1/sessions", headers=bearer(TOKENS["ns"]))).json()
    assert [s["id"] for s in answer["sessions"]] == ["mine"] and answer["next"] is None
    assert answer["sessions"][0]["last_turn"]["input"] == "input of mine"
    bad = await http.get("/v1/sessions", params={"after": "not a cursor"}, headers=bearer(TOKENS["ns"]))
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "schema_error"
    # a tool's output is not found from another namespace
    other = await http.get("/v1/executions/e1/output", headers=bearer(TOKENS["other"]))
    assert other.status_code == 404


async def test_operators_see_unknown_executions_and_how_many_workers_serve_each_route(local: Any) -> None:
    store, http = local
    bound = [_binding("send_email", "email"), _binding("greet", "lab")]
    await store.transact(lambda c: store.bindings.store_bindings(c, bound, "wake"))
    broker = http.broker

    async def nothing(delivery: Any) -> None:
        return None

    # Given a worker that consumes route email's commands, and none for route lab
    consumer = await broker.consume(broker.topology.commands("email"), nothing, prefetch=1)
    try:
        routes = (await http.get("/v1/operator/routes", headers=bearer(OPERATOR))).json()
    finally:
        await consumer.close()
    assert [(r["route"], r["tools"], r["workers"]) for r in routes] == [
        ("email", ["send_email"], 1),
        ("lab", ["greet"], 0),
    ]
    assert (await http.get("/v1/operator/unknown", headers=bearer(OPERATOR))).json() == []
    for route in ("/v1/operator/unknown", "/v1/operator/routes"):
        refused = await http.get(route, headers=bearer(TOKENS["ns"]))
        assert refused.status_code == 403, route


def _binding(name: str, route: str) -> ToolBinding:
    return ToolBinding.build(
        name=name, version="1", route=route, input_schema={"type": "object"}, replay_policy=ReplayPolicy.SAFE
    )


async def test_the_root_keeps_its_query_and_the_console_serves_its_own_files_only(local: Any) -> None:
    _, http = local
    answer = await http.get("/", params={"session": "s", "turn": "t"})
    assert answer.status_code == 307 and answer.headers["location"] == "/console?session=s&turn=t"
    page = await http.get("/console")
    assert page.status_code == 200 and 'src="/console/app.js"' in page.text
    script = await http.get("/console/app.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    for name in ("../app.py", "nothing.js", "..%2Fconsole.py"):
        assert (await http.get(f"/console/{name}")).status_code == 404, name
