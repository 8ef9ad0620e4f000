"""Session ids, threads and agent registrations belong to their namespace (a bearer token's):
two namespaces use the same session id and agent version each for its own, neither can block
the other's next version, and another namespace's id answers exactly what an unknown one does.
Over HTTP (the API served in this process) on both backends; a Brain and Hands running both
namespaces' turns under one session id is in tests/test_api.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from brain.api import Api, Tokens, hash_token
from brain.api.app import create_app
from brain.store import BrainStore
from infra.process.settings import Settings
from infra.transport import Topology
from local.testing import local_tendon
from tests.test_brain_store import _waiting_on, store

__all__ = ["store"]  # the fixture, used by name

TOKENS = {"ns": "token-of-ns", "other": "token-of-other"}


def support(instructions: str, version: str = "1") -> dict[str, Any]:
    model = {"kind": "scripted", "script": [{"content": "hi"}]}
    return {"name": "support", "version": version, "instructions": instructions, "model": model}


@pytest.fixture
async def http(store: BrainStore) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    """A client per namespace of an API over ``store`` (no Brain runs the turns: they stay queued)."""
    tokens = Tokens(",".join(f"{n}:{hash_token(t)}" for n, t in TOKENS.items()), "", "ns")
    api = Api(store=store, tokens=tokens, topology=Topology("t-ns"), wake_channel="wake")
    transport = httpx.ASGITransport(app=create_app(api))
    clients = {
        n: httpx.AsyncClient(
            transport=transport, base_url="http://brain", headers={"Authorization": f"Bearer {t}"}
        )
        for n, t in TOKENS.items()
    }
    yield clients
    for client in clients.values():
        await client.aclose()


async def submit(
    client: httpx.AsyncClient, session: str, request_id: str, agent: dict[str, Any]
) -> httpx.Response:
    return await client.post(
        f"/v1/sessions/{session}/turns", json={"request_id": request_id, "input": "go", "agent": agent}
    )


async def test_two_namespaces_use_one_session_id_and_agent_version_each_for_its_own(
    http: dict[str, httpx.AsyncClient],
) -> None:
    ns, other = http["ns"], http["other"]
    # Given a session "s1" of namespace ns, its thread pinned to agent support version 1
    mine = await submit(ns, "s1", "r1", support("ours"))
    assert mine.status_code == 201, mine.text
    # When namespace other submits to a session "s1" of its own, with the same request id and its
    # own, different definition of support version 1
    theirs = await submit(other, "s1", "r1", support("theirs"))
    # Then it is a new session and turn of its own, not a conflict with ns's
    assert theirs.status_code == 201, theirs.text
    mine_id, theirs_id = mine.json()["turn_id"], theirs.json()["turn_id"]
    assert mine_id != theirs_id
    # And each namespace sees its session "s1" as it named it, with its own turn and events only
    for client, turn in ((ns, mine_id), (other, theirs_id)):
        shown = (await client.get(f"/v1/turns/{turn}")).json()
        assert (shown["session_id"], shown["thread"]) == ("s1", "main")
        turns = (await client.get("/v1/sessions/s1/turns")).json()
        assert [(t["id"], t["session_id"], t["thread_id"], t["thread"]) for t in turns] == [
            (turn, "s1", "s1", "main")
        ]
        events = (await client.get("/v1/sessions/s1/events")).json()["events"]
        assert [(e["seq"], e["session_id"], e["thread"], e["turn_id"]) for e in events] == [
            (1, "s1", "main", turn)
        ]
        (thread,) = (await client.get("/v1/sessions/s1/threads")).json()
        assert (thread["id"], thread["agent_name"], thread["agent_version"]) == ("s1", "support", "1")
        snapshot = (await client.get("/v1/sessions/s1/snapshot")).json()
        assert [t["id"] for t in snapshot["turns"]] == [turn] and snapshot["session_id"] == "s1"
        sessions = (await client.get("/v1/sessions", params={"search": "s1"})).json()["sessions"]
        assert [(s["id"], s["last_turn"]["id"], s["last_turn"]["session_id"]) for s in sessions] == [
            ("s1", turn, "s1")
        ]
    # And an agent version is still immutable within its namespace
    changed = await submit(ns, "s2", "r1", support("ours, changed"))
    assert changed.status_code == 409 and "already registered with different content" in changed.text
    # And another namespace registering a next version first does not block this one's
    assert (await submit(other, "s3", "r1", support("squatted", version="2"))).status_code == 201
    next_version = await submit(ns, "s3", "r1", support("ours, next", version="2"))
    assert next_version.status_code == 201, next_version.text
    # And cancelling a turn and closing a session touch that namespace's only
    cancel = await other.post(f"/v1/turns/{theirs_id}/controls", json={"kind": "cancel"})
    assert cancel.json()["status"] == "applied", cancel.text
    assert (await other.post("/v1/sessions/s1/close")).json() == {"closed": True}
    assert (await ns.get(f"/v1/turns/{mine_id}")).json()["status"] == "queued"
    assert (await submit(ns, "s1", "r2", support("ours"))).status_code == 201
    assert (await submit(other, "s1", "r2", support("theirs"))).status_code == 409


def same_answer(known: httpx.Response, unknown: httpx.Response, real: str, made_up: str) -> bool:
    """Whether two answers are one answer, but for the id each was asked about."""
    return known.status_code == unknown.status_code and known.json() == json.loads(
        unknown.text.replace(made_up, real)
    )


async def test_another_namespaces_ids_answer_exactly_what_unknown_ids_answer(
    store: BrainStore, http: dict[str, httpx.AsyncClient]
) -> None:
    ns, other = http["ns"], http["other"]
    # Given a turn of namespace ns in session "shared" with a tool call, and a session "shared" of
    # namespace other too (so the id is known to both, each for its own)
    turn = (await submit(ns, "shared", "r1", support("ours"))).json()["turn_id"]
    await _waiting_on(store, turn, "exec-of-ns")
    assert (await submit(other, "shared", "r1", support("theirs"))).status_code == 201
    assert (await submit(ns, "only-ns", "r1", support("ours"))).status_code == 201
    # When namespace other asks about ns's ids, and about ids nobody has
    asked = [
        ("GET", "/v1/turns/{}", turn, None),
        ("GET", "/v1/turns/{}/history", turn, None),
        ("GET", "/v1/turns/{}/executions", turn, None),
        ("GET", "/v1/turns/{}/controls", turn, None),
        ("POST", "/v1/turns/{}/controls", turn, {"kind": "cancel", "request_id": "c1"}),
        ("POST", "/v1/turns/{}/controls", turn, {"kind": "steer", "request_id": "c2", "text": "x"}),
        ("POST", "/v1/turns/{}/respond", turn, {"call": "call-1", "decision": "approve"}),
        ("GET", "/v1/executions/{}/output", "exec-of-ns", None),
        ("GET", "/v1/sessions/shared/events?thread=main&turn={}", turn, None),
        ("GET", "/v1/sessions/shared/snapshot?thread=main&turn={}", turn, None),
        ("GET", "/v1/sessions/shared/stream?thread=main&turn={}", turn, None),
    ] + [
        (method, path, "only-ns", None)
        for method, path in (
            ("GET", "/v1/sessions/{}/threads"),
            ("GET", "/v1/sessions/{}/turns"),
            ("GET", "/v1/sessions/{}/events"),
            ("GET", "/v1/sessions/{}/snapshot"),
            ("GET", "/v1/sessions/{}/stream"),
            ("POST", "/v1/sessions/{}/close"),
            ("POST", "/v1/sessions/{}/close?thread=main"),
        )
    ]
    for method, path, real, body in asked:
        made_up = "x" * len(real)
        known = await other.request(method, path.format(real), json=body)
        unknown = await other.request(method, path.format(made_up), json=body)
        # Then each answer is the unknown id's, but for the id in it: the same status and body
        assert known.status_code == 404, (path, known.text)
        assert same_answer(known, unknown, real, made_up), (path, known.text, unknown.text)
    # And nothing of ns's changed: its turn was neither cancelled nor steered
    shown = (await ns.get(f"/v1/turns/{turn}")).json()
    assert shown["status"] == "waiting" and (await ns.get(f"/v1/turns/{turn}/controls")).json() == []


async def test_on_the_embedded_backend_two_namespaces_run_one_session_id_each_for_its_own(
    tmp_path: Path,
) -> None:
    # Given a local Tendon (SQLite, the Brain and the API in this process) with two namespaces' tokens
    tokens = ",".join(f"{n}:{hash_token(t)}" for n, t in TOKENS.items())
    settings = Settings(scan_interval=0.2, reconnect_grace=0.5, api_tokens=tokens)
    async with local_tendon(tmp_path, settings=settings) as running:
        clients = {
            n: httpx.AsyncClient(base_url=running.url, headers={"Authorization": f"Bearer {t}"}, timeout=30)
            for n, t in TOKENS.items()
        }
        try:
            # When each submits to session "s1" an agent "support" saying its own words, and waits
            asked = {}
            for n, client in clients.items():
                agent = {
                    **support(f"of {n}"),
                    "model": {"kind": "scripted", "script": [{"content": f"hi from {n}"}]},
                }
                body = {"request_id": "r1", "input": "go", "agent": agent}
                answer = await client.post("/v1/sessions/s1/turns", params={"wait": "30"}, json=body)
                assert answer.status_code == 201, answer.text
                asked[n] = answer.json()
            # Then each turn ran its own namespace's agent in its own session "s1"
            for n, answer in asked.items():
                turn = answer["turn"]
                assert (turn["status"], turn["session_id"], turn["result"]["text"]) == (
                    "completed",
                    "s1",
                    f"hi from {n}",
                )
                events = (await clients[n].get("/v1/sessions/s1/events")).json()["events"]
                assert {e["turn_id"] for e in events} == {answer["turn_id"]}
        finally:
            for client in clients.values():
                await client.aclose()
