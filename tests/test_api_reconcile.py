"""An operator's reconcile through the HTTP API, with the Brain and Hands as real processes on real
services: the Brain sends it to the Hands of the execution's route as a control, they carry it out
from their ledger, and the API answers with what the Brain applied of their event. The same on
the embedded mode (`brain serve --local`)."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from brain.api import hash_token
from examples.mailbox import MailboxServer
from tests.support import Observer, Processes, TendonEnv, free_port, wait_for

BRAIN = ["-m", "brain", "serve"]
HANDS = ["-m", "hands", "serve", "--route", "email", "--tools", "examples.email_tools"]
TENANT, OPERATOR = "token-of-acme", "token-of-the-operator"
# One email, sent by an unsafe tool that the blind mailbox below cannot be asked about afterwards.
AGENT = {
    "name": "one-notice",
    "version": "1",
    "tools": ["send_email"],
    "model": {
        "kind": "scripted",
        "script": [
            {"tool_calls": [{"tool": "send_email", "args": {
                "to": "customer1@example.com", "subject": "Notice", "body": "Down on Sunday."}}]},
            {"content": "sent"},
        ],
    },
}  # fmt: skip
# Where the worker dies: the mailbox took the email, the worker never recorded it.
DIE_AFTER_THE_SEND = "hands.after_tool_body@call-1"

pytestmark = pytest.mark.chaos


@pytest.fixture
def blind_mailbox() -> Iterator[MailboxServer]:
    with MailboxServer(port=0, lookup=False) as server:
        yield server


@dataclass
class Unknown:
    """A turn that waits for an operator: its one execution is UNKNOWN, and a worker serves its
    route (``worker``)."""

    url: str
    env: dict[str, str]
    turn_id: str
    execution_id: str
    worker: subprocess.Popen[bytes]
    mailbox: MailboxServer

    def operator(self) -> httpx.AsyncClient:
        return self._client(OPERATOR)

    def tenant(self) -> httpx.AsyncClient:
        return self._client(TENANT)

    def _client(self, token: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=90)

    def evidence(self) -> dict[str, Any]:
        """What the mailbox's own log says of the operation: the receipt, with the log's lines
        about it (over the offload threshold), and where it was read."""
        deliveries = self.mailbox.stats()["deliveries"]
        (receipt,) = [d for d in deliveries if d["idempotency_key"] == self.execution_id]
        result = {**receipt, "log": [f"line {i}: delivered" for i in range(500)]}
        return {"result": result, "evidence": f"the mailbox log lists {receipt['message_id']} for this key"}


@pytest.fixture
async def unknown(tendon: TendonEnv, processes: Processes, blind_mailbox: MailboxServer) -> Unknown:
    port = free_port()
    env = {
        **tendon.env,
        "TENDON_MAILBOX_URL": blind_mailbox.url,
        "TENDON_HTTP": f"127.0.0.1:{port}",
        "TENDON_API_TOKENS": f"acme:{hash_token(TENANT)}",
        "TENDON_OPERATOR_TOKENS": hash_token(OPERATOR),
        # Above what the turn's own messages weigh: a big reconcile goes by reference.
        "TENDON_OFFLOAD_THRESHOLD": "4096",
    }
    await processes.start_ready("brain", BRAIN, env)
    doomed = await processes.start_ready("hands", HANDS, {**env, "TENDON_KILL_AT": DIE_AFTER_THE_SEND})
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TENANT}"}) as http:
        body = {"request_id": "r1", "input": "send the notice", "agent": AGENT}
        answer = await http.post("/v1/sessions/s-reconcile/turns", json=body)
        assert answer.status_code == 201, answer.text
        turn_id = answer.json()["turn_id"]
        assert await processes.wait_exit(doomed) == -signal.SIGKILL
        worker = await processes.start_ready("hands", HANDS, env)
        execution = await wait_for(
            lambda: execution_of(http, turn_id, "unknown"), timeout=60, what="the execution to be UNKNOWN"
        )
    return Unknown(url, env, turn_id, execution["id"], worker, blind_mailbox)


async def execution_of(http: httpx.AsyncClient, turn_id: str, status: str) -> dict[str, Any] | None:
    (execution,) = (await http.get(f"/v1/turns/{turn_id}/executions")).json()
    return execution if execution["status"] == status else None  # type: ignore[no-any-return]


async def test_an_operator_reconciles_an_unknown_execution_through_the_api_and_its_turn_completes(
    unknown: Unknown, tendon: TendonEnv
) -> None:
    # Given a turn that waits for an operator: the mailbox took its email, nobody can ask it
    path = f"/v1/operator/executions/{unknown.execution_id}/reconcile"
    request = {"request_id": "rec-1", "actor": "ops", **unknown.evidence()}

    # When an operator reconciles the execution through the API
    async with unknown.operator() as operator:
        first = await operator.post(path, json=request)

    # Then the Hands of its route carried it out, and the answer is what the Brain applied
    assert first.status_code == 200, first.text
    assert first.json() == {
        "execution_id": unknown.execution_id, "turn_id": unknown.turn_id, "route": "email",
        "request_id": "rec-1", "status": "succeeded", "how": "reconciled",
        "evidence": request["evidence"], "message": None,
    }  # fmt: skip
    async with unknown.tenant() as tenant:
        turn = (await tenant.get(f"/v1/turns/{unknown.turn_id}", params={"wait": "30"})).json()
        assert turn["status"] == "completed"
        (execution,) = turn["executions"]
        assert (execution["how"], execution["result"]) == ("reconciled", request["result"])
        receipts = (await tenant.get(f"/v1/turns/{unknown.turn_id}/controls")).json()
    assert [(r["kind"], r["request_id"], r["status"]) for r in receipts] == [
        ("reconcile", "rec-1", "applied")
    ]
    obs = Observer(tendon)
    audit = await obs.fetch("SELECT execution_id, request_id, actor, outcome FROM {hands}.reconciliations")
    assert [tuple(a) for a in audit] == [(unknown.execution_id, "rec-1", "ops", "succeeded")]
    assert len(unknown.mailbox.stats()["deliveries"]) == 1  # nothing was sent again

    # When the same request comes again, and its request id with another input
    async with unknown.operator() as operator:
        again = await operator.post(path, json=request)
        other = await operator.post(path, json={**request, "evidence": "a guess"})

    # Then the first answers the same, the second is a conflict, and nothing more was done or sent
    assert (again.status_code, again.json()) == (200, first.json())
    assert (other.status_code, other.json()["error"]["code"]) == (409, "conflict")
    assert len(await obs.fetch("SELECT * FROM {hands}.reconciliations")) == 1
    (queued,) = await obs.fetch("SELECT payload FROM {brain}.outbox WHERE queue LIKE '%.email.controls'")
    assert json.loads(bytes(queued["payload"]))["body_ref"] is not None  # the big body went by reference


async def test_a_reconcile_while_no_worker_serves_the_route_is_requested_and_done_once_one_does(
    unknown: Unknown, processes: Processes, tendon: TendonEnv
) -> None:
    # Given an UNKNOWN execution whose route nobody serves any more
    unknown.worker.send_signal(signal.SIGTERM)
    assert await processes.wait_exit(unknown.worker) == 0
    path = f"/v1/operator/executions/{unknown.execution_id}/reconcile"
    request = {"request_id": "rec-late", "actor": "ops", "failure": "bounced, says the mailbox",
               "evidence": "the mailbox's bounce report"}  # fmt: skip

    # When an operator reconciles it and waits a second
    async with unknown.operator() as operator:
        waited = await operator.post(path, json=request, params={"wait": "1s"})

    # Then the answer says it is requested, committed, and which route must be served
    assert waited.status_code == 202, waited.text
    answer = waited.json()
    assert (answer["status"], answer["route"], answer["request_id"]) == ("requested", "email", "rec-late")
    assert "no worker of route email answered" in answer["message"]
    assert "once one serves route email" in answer["message"]

    # When a worker serves the route again
    await processes.start_ready("hands", HANDS, unknown.env)

    # Then the reconcile is carried out and the turn goes on: the model is told of the failure
    obs = Observer(tendon)
    await obs.wait_turn(unknown.turn_id, "completed")
    (execution,) = await obs.executions(unknown.turn_id)
    assert (execution["status"], execution["how"]) == ("failed", "reconciled")
    assert execution["error"] == {"code": "reconciled_failure", "message": "bounced, says the mailbox"}
    async with unknown.operator() as operator:
        done = await operator.post(path, json=request)
    assert done.status_code == 200 and (done.json()["status"], done.json()["how"]) == ("failed", "reconciled")
    assert len(await obs.fetch("SELECT * FROM {hands}.reconciliations")) == 1


async def test_the_embedded_mode_reconciles_an_unknown_execution_through_its_api(
    processes: Processes, tmp_path: Path, blind_mailbox: MailboxServer
) -> None:
    # Given `brain serve --local` (Brain and Hands in one process, SQLite, the local queue) that
    # died right after its tool sent the email, and started again: the execution is UNKNOWN
    port = free_port()
    data = tmp_path / "data"
    args = [*BRAIN, "--local", "--data-dir", str(data), "--tools", "examples.email_tools"]
    args += ["--http", f"127.0.0.1:{port}"]
    env = {"TENDON_LOG_FORMAT": "json", "TENDON_MAILBOX_URL": blind_mailbox.url}
    doomed = await processes.start_ready("local", args, {**env, "TENDON_KILL_AT": DIE_AFTER_THE_SEND})
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, timeout=90) as http:  # no tokens: a development server
        await wait_for(lambda: answers(http), timeout=30, what="the local server's HTTP API")
        body = {"request_id": "r1", "input": "send the notice", "agent": AGENT}
        answer = await http.post("/v1/sessions/s-local/turns", json=body)
        assert answer.status_code == 201, answer.text
        turn_id = answer.json()["turn_id"]
        assert await processes.wait_exit(doomed) == -signal.SIGKILL
        await processes.start_ready("local", args, env)
        await wait_for(lambda: answers(http), timeout=30, what="the local server's HTTP API")
        execution = await wait_for(
            lambda: execution_of(http, turn_id, "unknown"), timeout=60, what="the execution to be UNKNOWN"
        )

        # When the operator reconciles it through the same API
        path = f"/v1/operator/executions/{execution['id']}/reconcile"
        request = {"request_id": "rec-1", "actor": "ops", "result": {"sent": True}, "evidence": "mailbox log"}
        reconciled = await http.post(path, json=request)

        # Then the process's own Hands pool carried it out, and the turn completes
        assert reconciled.status_code == 200, reconciled.text
        assert (reconciled.json()["status"], reconciled.json()["how"]) == ("succeeded", "reconciled")
        turn = (await http.get(f"/v1/turns/{turn_id}", params={"wait": "30"})).json()
        assert turn["status"] == "completed"
        again = await http.post(path, json=request)
        assert (again.status_code, again.json()) == (200, reconciled.json())

    def audit() -> list[tuple[Any, ...]]:
        db = sqlite3.connect(data / "hands.sqlite3")
        try:
            rows = db.execute("SELECT execution_id, request_id, result FROM reconciliations").fetchall()
        finally:
            db.close()
        return [(e, r, json.loads(result)) for e, r, result in rows]

    assert await asyncio.to_thread(audit) == [(execution["id"], "rec-1", {"sent": True})]


async def answers(http: httpx.AsyncClient) -> bool:
    # The Hands pools of the process may be ready before its Brain's HTTP API.
    try:
        return (await http.get("/openapi.json")).status_code == 200
    except httpx.TransportError:
        return False
