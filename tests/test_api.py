"""The HTTP API of a real Brain process (PostgreSQL, RabbitMQ, a Hands pool): submit and read
turns, controls, events with cursors and filters, Server-Sent Events resumed across a cut, the
snapshot-then-follow promise, bearer tokens per namespace on every route, the Python client."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from brain import AsyncClient, Client
from brain.api import console, hash_token, operator, routes, stream
from brain.api.routes import MAX_WAIT, seconds
from protocol import SchemaError
from tests.support import Observer, Processes, TendonEnv, free_port, wait_for

BRAIN = ["-m", "brain", "serve"]
HANDS_BULK = ["-m", "hands", "serve", "--route", "bulk", "--tools", "tests.brain_e2e_tools"]
TOKENS = {"acme": "token-of-acme", "other": "token-of-other"}
OPERATOR = "token-of-the-operator"

pytestmark = pytest.mark.chaos


def agent(script: list[dict[str, Any]], name: str = "api-agent", **fields: Any) -> dict[str, Any]:
    model = {"kind": "scripted", "script": script}
    return {"name": name, "version": "1", "tools": ["slow_step"], "model": model, **fields}


TOOL_THEN_DONE = agent(
    [{"tool_calls": [{"tool": "slow_step", "args": {"seconds": 0.05}}]}, {"content": "done"}]
)


class Server:
    def __init__(self, url: str) -> None:
        self.url = url

    def client(self, namespace: str | None = "acme", token: str | None = None) -> httpx.AsyncClient:
        token = token or (TOKENS[namespace] if namespace else OPERATOR)
        return httpx.AsyncClient(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


@pytest.fixture
async def server(tendon: TendonEnv, processes: Processes) -> Server:
    tendon.routes.add("bulk")
    port = free_port()
    env = {
        **tendon.env,
        "TENDON_HTTP": f"127.0.0.1:{port}",
        "TENDON_API_TOKENS": ",".join(f"{ns}:{hash_token(t)}" for ns, t in TOKENS.items()),
        "TENDON_OPERATOR_TOKENS": hash_token(OPERATOR),
    }
    await processes.start_ready("brain", BRAIN, env)
    await processes.start_ready("hands", HANDS_BULK, env)
    return Server(f"http://127.0.0.1:{port}")


async def submit(
    http: httpx.AsyncClient, session: str, request_id: str, definition: dict[str, Any], **extra: Any
) -> str:
    body = {"request_id": request_id, "input": "go", "agent": definition, **extra}
    response = await http.post(f"/v1/sessions/{session}/turns", json=body)
    assert response.status_code in (200, 201), response.text
    return str(response.json()["turn_id"])


async def test_a_turn_is_submitted_read_and_waited_for_and_its_request_id_is_idempotent(
    server: Server,
) -> None:
    async with server.client() as http:
        response = await http.post(
            "/v1/sessions/s1/turns", json={"request_id": "r1", "input": "go", "agent": TOOL_THEN_DONE}
        )
        assert response.status_code == 201 and response.json()["created"] is True
        turn = response.json()["turn_id"]
        again = await http.post(
            "/v1/sessions/s1/turns", json={"request_id": "r1", "input": "go", "agent": TOOL_THEN_DONE}
        )
        assert (again.status_code, again.json()) == (200, {"turn_id": turn, "created": False})
        other = await http.post(
            "/v1/sessions/s1/turns", json={"request_id": "r1", "input": "no", "agent": TOOL_THEN_DONE}
        )
        assert other.status_code == 409 and other.json()["error"]["code"] == "conflict"

        done = (await http.get(f"/v1/turns/{turn}", params={"wait": "30s"})).json()
        assert done["status"] == "completed" and done["result"] == {"text": "done"}
        history = (await http.get(f"/v1/turns/{turn}/history")).json()
        assert [c["status"] for c in history["model_calls"]] == ["replied", "replied"]
        (execution,) = (await http.get(f"/v1/turns/{turn}/executions")).json()
        assert execution["status"] == "succeeded"
        listed = (await http.get("/v1/sessions/s1/turns")).json()
        assert isinstance(listed, list), listed
        assert [t["id"] for t in listed] == [turn]
        bad = await http.post("/v1/sessions/s1/turns", json={"request_id": "r2", "input": "go"})
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "schema_error"


async def test_a_submit_the_brain_serves_starts_its_turn_in_the_same_commit(server: Server) -> None:
    # A new session's turn whose tools are announced: accepted, claimed and prepared in one entry
    # (one commit), then run here; a second turn of the thread, submitted while the first is
    # unfinished, is queued and claimed once the first ended.
    async with server.client() as http:
        first = await submit(http, "s-served", "r1", TOOL_THEN_DONE)
        second = await submit(http, "s-served", "r2", TOOL_THEN_DONE)
        for t in (first, second):
            assert (await http.get(f"/v1/turns/{t}", params={"wait": "30"})).json()["status"] == "completed"
        events = (await http.get("/v1/sessions/s-served/events", params={"limit": 1000})).json()["events"]
    kinds = {
        t: [[f["kind"] for f in e["facts"]] for e in events if e["turn_id"] == t] for t in (first, second)
    }
    assert kinds[first][0] == ["turn.accepted", "turn.run_started", "turn.prepared"], kinds[first]
    assert kinds[second][0] == ["turn.accepted"] and ["turn.run_started", "turn.prepared"] in kinds[second]
    ended = next(i for i, e in enumerate(events) if e["turn_id"] == first and e["status"] == "completed")
    began = next(i for i, e in enumerate(events) if e["turn_id"] == second and e["status"] == "running")
    assert began > ended


async def _doomed_brain(
    tendon: TendonEnv, processes: Processes, kill_at: str
) -> tuple[int, dict[str, str], subprocess.Popen[bytes]]:
    """A Hands pool, and a Brain serving the API on a port of its own that dies at ``kill_at``:
    (its port, the environment a standby takes to serve there, the doomed process)."""
    tendon.routes.add("bulk")
    port = free_port()
    env = {**tendon.env, "TENDON_HTTP": f"127.0.0.1:{port}"}
    await processes.start_ready("hands", HANDS_BULK, tendon.env)
    doomed = await processes.start_ready("brain", BRAIN, {**env, "TENDON_KILL_AT": kill_at})
    return port, env, doomed


async def test_a_turn_its_brain_started_at_submit_survives_that_brains_death(
    tendon: TendonEnv, processes: Processes
) -> None:
    # Given a Brain that serves the API and dies before its first model call, and a standby
    port, _, doomed = await _doomed_brain(tendon, processes, "brain.before_model_call@1")
    # When it accepts a turn it starts in the same commit (the answer may not make it out)
    body = {"request_id": "r1", "input": "go", "agent": TOOL_THEN_DONE}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        with contextlib.suppress(httpx.TransportError):
            await http.post("/v1/sessions/s-doomed/turns", json=body)
    assert await processes.wait_exit(doomed) == -signal.SIGKILL
    obs = Observer(tendon)
    turns = "SELECT id, status, lease_owner FROM {brain}.turns WHERE session_id = 'default/s-doomed'"
    (row,) = await obs.fetch(turns)
    assert row["status"] == "running" and row["lease_owner"] is not None  # started, held by the dead
    (first,) = await obs.fetch("SELECT facts FROM {brain}.journal WHERE session_id = 'default/s-doomed'")
    assert [f["kind"] for f in first["facts"]] == ["turn.accepted", "turn.run_started", "turn.prepared"]
    # Then the standby takes it over once the death is seen, and the turn completes once
    await processes.start_ready("brain", BRAIN, tendon.env)
    await obs.wait_turn(row["id"], "completed", timeout=60)
    runs = await obs.fetch("SELECT runs FROM {brain}.turns WHERE id = $1", row["id"])
    assert runs[0]["runs"] >= 2


async def test_a_brain_killed_once_its_submits_committed_loses_none_and_runs_none_twice(
    tendon: TendonEnv, processes: Processes
) -> None:
    # Given a Brain that dies once a batch of the submits it serves committed, before it answers
    port, env, doomed = await _doomed_brain(tendon, processes, "brain.after_submit_commit")
    sessions = [f"s-batch-{i}" for i in range(8)]
    body = {"request_id": "r1", "input": "go", "agent": TOOL_THEN_DONE}
    # When clients submit at once: none hears back
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        answers = await asyncio.gather(
            *(http.post(f"/v1/sessions/{s}/turns", json=body) for s in sessions), return_exceptions=True
        )
    assert all(isinstance(a, httpx.TransportError) for a in answers), answers
    assert await processes.wait_exit(doomed) == -signal.SIGKILL
    obs = Observer(tendon)
    # (the store keys a session by its namespace, here the default one, and its id)
    turns = "SELECT session_id, id FROM {brain}.turns WHERE session_id LIKE 'default/s-batch-%'"
    committed = {r["session_id"].removeprefix("default/"): r["id"] for r in await obs.fetch(turns)}
    assert committed, "the kill point comes after a commit"
    # Then, with a standby serving, each client's retry finds the turn its submit committed (or
    # makes it, when its submit had not committed), and every turn completes with one execution
    await processes.start_ready("brain", BRAIN, env)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        retried = [(await http.post(f"/v1/sessions/{s}/turns", json=body)).json() for s in sessions]
    for s, answer in zip(sessions, retried, strict=True):
        if s in committed:
            assert answer == {"turn_id": committed[s], "created": False}
        else:
            assert answer["created"] is True
    for answer in retried:
        await obs.wait_turn(answer["turn_id"], "completed", timeout=60)
    per_turn = await obs.fetch(
        "SELECT t.id, count(e.id) AS n FROM {brain}.turns t LEFT JOIN {brain}.executions e"
        " ON e.turn_id = t.id WHERE t.session_id LIKE 'default/s-batch-%' GROUP BY t.id"
    )
    assert sorted(r["n"] for r in per_turn) == [1] * len(sessions)


async def test_a_long_wait_never_cancels_the_turn(server: Server) -> None:
    slow = agent(
        [{"tool_calls": [{"tool": "slow_step", "args": {"seconds": 3}}]}, {"content": "done"}], name="slow"
    )
    async with server.client() as http:
        turn = await submit(http, "s-wait", "r1", slow)
        short = (await http.get(f"/v1/turns/{turn}", params={"wait": "1"})).json()
        assert short["status"] in ("queued", "running", "waiting")
        done = (await http.get(f"/v1/turns/{turn}", params={"wait": "30s"})).json()
        assert done["status"] == "completed"


async def test_controls_through_the_api_answer_receipts(server: Server) -> None:
    slow = agent(
        [{"tool_calls": [{"tool": "slow_step", "args": {"seconds": 2}}]}, {"content": "done"}], name="slow"
    )
    async with server.client() as http:
        turn = await submit(http, "s-ctl", "r1", slow)

        async def running() -> Any:
            d = (await http.get(f"/v1/turns/{turn}")).json()
            return d if d["executions"] and d["executions"][0]["status"] == "running" else None

        await wait_for(running, timeout=30, what="the tool to run")
        paused = (
            await http.post(f"/v1/turns/{turn}/controls", json={"kind": "pause", "request_id": "p"})
        ).json()
        assert paused["status"] == "applied"
        again = (
            await http.post(f"/v1/turns/{turn}/controls", json={"kind": "pause", "request_id": "p"})
        ).json()
        assert again == paused
        revision = (await http.get(f"/v1/turns/{turn}")).json()["revision"]
        stale = (
            await http.post(f"/v1/turns/{turn}/controls", json={"kind": "resume", "revision": revision - 1})
        ).json()
        assert stale["status"] == "rejected"
        resumed = (
            await http.post(f"/v1/turns/{turn}/controls", json={"kind": "resume", "revision": revision})
        ).json()
        assert resumed["status"] == "applied"
        assert (await http.get(f"/v1/turns/{turn}", params={"wait": "30"})).json()["status"] == "completed"
        kinds = [(r["kind"], r["status"]) for r in (await http.get(f"/v1/turns/{turn}/controls")).json()]
        assert kinds == [("pause", "applied"), ("resume", "rejected"), ("resume", "applied")]


async def test_events_page_with_cursors_filters_and_refuse_a_turn_filter_without_its_thread(
    server: Server,
) -> None:
    async with server.client() as http:
        first = await submit(http, "s-ev", "r1", TOOL_THEN_DONE)
        second = await submit(http, "s-ev", "r2", TOOL_THEN_DONE, thread="b")
        for t in (first, second):
            assert (await http.get(f"/v1/turns/{t}", params={"wait": "30"})).json()["status"] == "completed"
        everything = (await http.get("/v1/sessions/s-ev/events", params={"limit": 1000})).json()
        seqs = [e["seq"] for e in everything["events"]]
        assert seqs == sorted(seqs) and len(seqs) == len(set(seqs)) and everything["cursor"] == seqs[-1]
        # a page at a time gives the same events, each once
        paged, cursor = [], 0
        while True:
            page = (await http.get("/v1/sessions/s-ev/events", params={"cursor": cursor, "limit": 3})).json()
            paged += page["events"]
            if not page["events"]:
                break
            cursor = page["cursor"]
        assert [e["seq"] for e in paged] == seqs
        # filters: a thread, a turn of that thread, a run of that turn
        only_b = (await http.get("/v1/sessions/s-ev/events", params={"thread": "b"})).json()["events"]
        assert only_b and {e["turn_id"] for e in only_b} == {second}
        of_turn = (
            await http.get("/v1/sessions/s-ev/events", params={"thread": "main", "turn": first})
        ).json()
        assert {e["turn_id"] for e in of_turn["events"]} == {first}
        run = next(e["run"] for e in of_turn["events"] if e["run"] is not None)
        of_run = (
            await http.get("/v1/sessions/s-ev/events", params={"thread": "main", "turn": first, "run": run})
        ).json()
        assert of_run["events"] and {e["run"] for e in of_run["events"]} == {run}
        # refused: a turn without its thread, a run without its turn, a turn of another thread
        no_thread = await http.get("/v1/sessions/s-ev/events", params={"turn": first})
        assert no_thread.status_code == 422 and "needs its thread" in no_thread.json()["error"]["message"]
        assert (
            await http.get("/v1/sessions/s-ev/events", params={"thread": "main", "run": 1})
        ).status_code == 422
        wrong = await http.get("/v1/sessions/s-ev/events", params={"thread": "b", "turn": first})
        assert wrong.status_code == 404
        # a snapshot says which cursor it is consistent with
        snap = (await http.get("/v1/sessions/s-ev/snapshot")).json()
        assert snap["cursor"] == seqs[-1] and {t["id"] for t in snap["turns"]} == {first, second}


async def _read_stream(url: str, token: str, session: str, last_id: int, count: int) -> list[dict[str, Any]]:
    """``count`` entry events of a session's stream after ``last_id``; then the connection is cut."""
    got: list[dict[str, Any]] = []
    headers = {"Authorization": f"Bearer {token}", "Last-Event-ID": str(last_id)}
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(None, connect=10)) as http:
        async with http.stream("GET", f"/v1/sessions/{session}/stream", headers=headers) as response:
            assert response.status_code == 200
            event_id, kind = None, None
            async for line in response.aiter_lines():
                if line.startswith("id:"):
                    event_id = int(line[3:].strip())
                elif line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:") and kind == "entry":
                    got.append({"id": event_id, **json.loads(line[5:])})
                    if len(got) == count:
                        return got  # leaving the block cuts the connection
    return got


async def test_a_stream_resumed_after_a_cut_gives_every_committed_event_once_in_order(server: Server) -> None:
    async with server.client() as http:
        turns = [await submit(http, "s-sse", f"r{i}", TOOL_THEN_DONE) for i in range(3)]
        # the first connection reads a few events and is cut while turns still commit
        first = await _read_stream(server.url, TOKENS["acme"], "s-sse", 0, 4)
        assert [e["id"] for e in first] == [e["seq"] for e in first]
        for t in turns:
            assert (await http.get(f"/v1/turns/{t}", params={"wait": "30"})).json()["status"] == "completed"
        total = len((await http.get("/v1/sessions/s-sse/events", params={"limit": 1000})).json()["events"])
        # the second resumes from the last id it saw
        rest = await _read_stream(server.url, TOKENS["acme"], "s-sse", first[-1]["id"], total - len(first))
    seqs = [e["seq"] for e in first + rest]
    assert seqs == list(range(1, total + 1))  # every event once, in order, nothing lost or repeated


async def test_a_snapshot_then_follow_misses_nothing_and_repeats_nothing(server: Server) -> None:
    async with server.client() as http:
        early = await submit(http, "s-snap", "r1", TOOL_THEN_DONE)
        assert (await http.get(f"/v1/turns/{early}", params={"wait": "30"})).json()["status"] == "completed"
        snap = (await http.get("/v1/sessions/s-snap/snapshot")).json()
        late = await submit(http, "s-snap", "r2", TOOL_THEN_DONE)
        assert (await http.get(f"/v1/turns/{late}", params={"wait": "30"})).json()["status"] == "completed"
        after = (await http.get("/v1/sessions/s-snap/events", params={"cursor": snap["cursor"]})).json()[
            "events"
        ]
        everything = (await http.get("/v1/sessions/s-snap/events")).json()["events"]
    assert [e["seq"] for e in after] == [e["seq"] for e in everything if e["seq"] > snap["cursor"]]
    assert {e["turn_id"] for e in after} == {late}


async def test_a_cursor_older_than_what_is_kept_is_gone_never_silently_skipped(
    server: Server, tendon: TendonEnv
) -> None:
    async with server.client() as http:
        turn = await submit(http, "s-old", "r1", TOOL_THEN_DONE)
        assert (await http.get(f"/v1/turns/{turn}", params={"wait": "30"})).json()["status"] == "completed"
        # What retention does (nothing trims yet): the session's first entries are gone.
        conn = await asyncpg.connect(tendon.database_url)
        try:
            await conn.execute(
                f"DELETE FROM {tendon.schemas[0]}.journal WHERE session_id = 'acme/s-old' AND seq <= 2"
            )
        finally:
            await conn.close()
        for cursor in (0, 1):
            events = await http.get("/v1/sessions/s-old/events", params={"cursor": cursor})
            assert events.status_code == 410 and "snapshot" in events.json()["error"]["message"]
            stream = await http.get("/v1/sessions/s-old/stream", params={"cursor": cursor})
            assert stream.status_code == 410, stream.text
        # From the last trimmed entry on, everything kept is there.
        kept = (await http.get("/v1/sessions/s-old/events", params={"cursor": 2})).json()["events"]
        assert kept and kept[0]["seq"] == 3


async def test_each_namespace_sees_and_controls_only_its_own(server: Server) -> None:
    async with (
        server.client("acme") as acme,
        server.client("other") as other,
        server.client(None) as operator,
    ):
        turn = await submit(acme, "s-own", "r1", TOOL_THEN_DONE)
        tenant_routes = [
            ("GET", f"/v1/turns/{turn}", None),
            ("GET", f"/v1/turns/{turn}/history", None),
            ("GET", f"/v1/turns/{turn}/executions", None),
            ("GET", f"/v1/turns/{turn}/controls", None),
            ("POST", f"/v1/turns/{turn}/controls", {"kind": "cancel"}),
            ("POST", f"/v1/turns/{turn}/respond", {"call": "c", "decision": "approve"}),
            ("GET", "/v1/sessions/s-own/threads", None),
            ("GET", "/v1/sessions/s-own/turns", None),
            ("GET", "/v1/sessions/s-own/events", None),
            ("GET", "/v1/sessions/s-own/snapshot", None),
            ("GET", "/v1/sessions/s-own/stream", None),
            ("POST", "/v1/sessions/s-own/close", None),
        ]
        for method, path, body in tenant_routes:
            seen = await other.request(method, path, json=body)
            assert seen.status_code == 404, (path, seen.text)  # not even told it exists
            assert (await operator.request(method, path, json=body)).status_code == 403, path
        # a session id and an agent version belong to their namespace: another one's of the same id
        # and version (here with other content) is its own, and runs its tool as acme's does
        theirs_agent = agent([{"tool_calls": [{"tool": "slow_step", "args": {"seconds": 0.05}}]},
                              {"content": "done by other"}])  # fmt: skip
        theirs = await submit(other, "s-own", "r1", theirs_agent)
        assert theirs != turn
        for http, own, said in ((other, theirs, "done by other"), (acme, turn, "done")):
            done = (await http.get(f"/v1/turns/{own}", params={"wait": "30"})).json()
            assert (done["status"], done["session_id"], done["thread"]) == ("completed", "s-own", "main")
            assert [e["status"] for e in done["executions"]] == ["succeeded"]
            assert done["result"]["text"] == said  # each ran its own namespace's definition
        operator_routes = [
            ("GET", "/v1/operator/parked"),
            ("GET", "/v1/operator/unknown"),
            ("GET", "/v1/operator/routes"),
            ("POST", "/v1/operator/executions/x/reconcile"),
        ]
        for method, path in operator_routes:
            answer = await acme.request(method, path, json={"evidence": "e", "actor": "a", "result": 1})
            assert answer.status_code == 403, path
        assert (await operator.get("/v1/operator/parked")).status_code == 200
        async with httpx.AsyncClient(base_url=server.url) as anonymous:
            assert (await anonymous.get(f"/v1/turns/{turn}")).status_code == 401
        async with server.client(token="not-a-token") as stranger:
            assert (await stranger.get(f"/v1/turns/{turn}")).status_code == 401
        assert (await acme.get(f"/v1/turns/{turn}", params={"wait": "30"})).json()["status"] == "completed"
        (execution,) = (await acme.get(f"/v1/turns/{turn}/executions")).json()
        output = f"/v1/executions/{execution['id']}/output"
        assert (await acme.get(output)).status_code == 200
        assert (await other.get(output)).status_code == 404
        assert (await operator.get(output)).status_code == 403
        listed = (await other.get("/v1/sessions")).json()["sessions"]
        assert [(s["id"], s["last_turn"]["id"]) for s in listed] == [("s-own", theirs)]  # its own only
        routes = (await operator.get("/v1/operator/routes")).json()
        assert {"route": "bulk", "workers": 1} in [{k: r[k] for k in ("route", "workers")} for r in routes]


async def test_a_reconcile_of_an_execution_that_is_not_unknown_or_not_known_or_malformed_is_refused(
    server: Server, tendon: TendonEnv
) -> None:
    # Given a turn whose tool ran and succeeded
    async with server.client() as acme:
        turn = await submit(acme, "s-reconcile", "r1", TOOL_THEN_DONE)
        assert (await acme.get(f"/v1/turns/{turn}", params={"wait": "30"})).json()["status"] == "completed"
        (execution,) = (await acme.get(f"/v1/turns/{turn}/executions")).json()
    path = f"/v1/operator/executions/{execution['id']}/reconcile"
    good = {"request_id": "rec-1", "evidence": "seen in the log", "actor": "ops"}

    async with server.client(namespace=None) as operator:
        # When an operator reconciles it, then the refusal says it is not UNKNOWN, and how it ended
        refused = await operator.post(path, json={**good, "result": {"ok": True}})
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "illegal_transition"
        assert (
            f"execution {execution['id']} is SUCCEEDED (ran), not UNKNOWN"
            in refused.json()["error"]["message"]
        )
        # an execution nobody knows is not found; a body with both or neither outcome, or a bad
        # wait, is refused before anything is looked up
        missing = await operator.post("/v1/operator/executions/nope/reconcile", json={**good, "result": 1})
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")
        for outcome in ({}, {"result": 1, "failure": "no"}, {"result": None, "failure": "no"}):
            bad = await operator.post(path, json={**good, **outcome})
            assert (bad.status_code, bad.json()["error"]["code"]) == (422, "schema_error"), outcome
            assert "exactly one of result (any JSON) or failure" in bad.json()["error"]["message"]
        blank = await operator.post(path, json={**good, "evidence": "  ", "result": 1})
        assert blank.status_code == 422 and "needs evidence" in blank.json()["error"]["message"]
        nul = await operator.post(path, json={**good, "result": {"note": "a\u0000b"}})
        assert nul.status_code == 422 and "NUL" in nul.json()["error"]["message"]
        raw = b'{"request_id": "rec-1", "evidence": "e", "actor": "ops", "result": 1e400}'
        huge = await operator.post(path, content=raw, headers={"Content-Type": "application/json"})
        assert huge.status_code == 422, huge.text
        bad_wait = await operator.post(path, json={**good, "result": 1}, params={"wait": "soon"})
        assert bad_wait.status_code == 422
    # Then nothing was sent to the Hands, and nothing recorded on the turn
    obs = Observer(tendon)
    assert await obs.fetch("SELECT * FROM {brain}.outbox") == []
    assert await obs.fetch("SELECT * FROM {brain}.controls") == []


async def test_the_python_client_submits_calls_controls_and_follows_events(
    server: Server, tmp_path: Path
) -> None:
    async with AsyncClient(server.url, TOKENS["acme"]) as tendon:
        done = await tendon.call("s-client", "r1", "go", TOOL_THEN_DONE)
        assert done["status"] == "completed"
        seen: list[dict[str, Any]] = []

        async def follow() -> None:
            async for event in tendon.events("s-client"):
                seen.append(event)
                if any(f["kind"] == "turn.completed" for f in event.get("facts", [])):
                    return

        await asyncio.wait_for(follow(), 30)
    assert seen[0]["seq"] == 1 and [e["seq"] for e in seen] == list(range(1, len(seen) + 1))
    # The sync client, as code that is not async uses it (here on a thread of its own)
    sync = Client(server.url, TOKENS["acme"])
    assert (await asyncio.to_thread(sync.turn, done["turn_id"]))["status"] == "completed"
    paged = await asyncio.to_thread(lambda: [e["seq"] for e in sync.events("s-client", limit=2)])
    assert paged == [e["seq"] for e in seen]


async def test_the_openapi_document_describes_every_route(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        doc = (await http.get("/openapi.json")).json()
    assert {
        "/v1/sessions/{session_id}/turns",
        "/v1/turns/{turn_id}/controls",
        "/v1/sessions/{session_id}/stream",
        "/v1/operator/executions/{execution_id}/reconcile",
    } <= set(doc["paths"])


def test_a_wait_is_read_as_seconds_capped_at_a_minute_and_anything_else_is_refused() -> None:
    assert (seconds(None), seconds("30s"), seconds(" 1.5 "), seconds("0")) == (0.0, 30.0, 1.5, 0.0)
    assert seconds("99999") == MAX_WAIT
    for bad in ("", "-1", "1m", "30ss", "nan", "1e3"):
        with pytest.raises(SchemaError):
            seconds(bad)


def test_no_route_hands_a_request_to_a_worker_thread() -> None:
    # FastAPI runs a plain-function endpoint or dependency in a worker thread: a hand-over to
    # another thread and back on every request, for functions that do no blocking I/O.
    found = []

    def look(dependant: Dependant, where: str) -> None:
        if dependant.call is not None and not inspect.iscoroutinefunction(dependant.call):
            found.append(f"{where}: {dependant.call.__name__}")
        for dependency in dependant.dependencies:
            look(dependency, where)

    for router in (console.router, operator.router, operator.metrics, routes.router, stream.router):
        for route in router.routes:
            assert isinstance(route, APIRoute)
            look(route.dependant, route.path)
    assert found == []
