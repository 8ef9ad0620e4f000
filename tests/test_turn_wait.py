"""`GET /v1/turns/{id}?wait=` and `POST /v1/sessions/{id}/turns?wait=` (submit and wait, one
request): a turn that ends in this Brain answers its waiters as soon as the end commits; one that
ends elsewhere (another Brain) is seen at the next look; a wait never cancels its turn."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from brain import AsyncClient
from brain.api import Api, Tokens
from brain.api.app import create_app
from brain.api.server import serving
from brain.face import commands
from brain.store import BrainStore
from infra.process.settings import Settings
from infra.transport import Topology
from infra.transport.localqueue import LocalBroker
from tests.support import wait_for
from tests.test_brain_claims import _context
from tests.test_brain_store import AGENT_DEF, pg_store

__all__ = ["pg_store"]  # the fixture, used by name

BODY = {"request_id": "r-1", "input": "hello", "agent": AGENT_DEF}


def _api(store: BrainStore, wait_poll: float) -> Api:
    return Api(
        store=store, tokens=Tokens("", "", "default"), topology=Topology("t-wait"), wake_channel="w",
        wait_poll=wait_poll,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def _http(api: Api) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``api``'s app, in this process."""
    transport = httpx.ASGITransport(app=create_app(api))
    async with httpx.AsyncClient(transport=transport, base_url="http://brain") as http:
        yield http


async def _end(store: BrainStore, turn_id: str) -> None:
    async with store.pool.acquire() as conn:
        await conn.execute("UPDATE turns SET status = 'completed' WHERE id = $1", turn_id)


async def _waiting(api: Api, turn_id: str) -> None:
    async def waits() -> bool:
        return api.endings.waiting(turn_id) > 0

    await wait_for(waits, timeout=10, interval=0.01, what="the wait to start")


async def test_a_wait_answers_when_its_turn_ends_here_not_at_its_next_look(pg_store: BrainStore) -> None:
    # Given an API whose waits look again only once a minute, and a client waiting for a turn
    api = _api(pg_store, wait_poll=60.0)
    described: list[str] = []
    view = pg_store.views.turn_view

    async def spy(conn: Any, namespace: str, turn_id: str) -> Any:
        described.append(turn_id)  # a description reads the turn's view; a look, its row only
        return await view(conn, namespace, turn_id)

    pg_store.views.turn_view = spy  # type: ignore[method-assign]
    async with _http(api) as http:
        turn = (await http.post("/v1/sessions/s-1/turns", json=BODY)).json()["turn_id"]
        waiting = asyncio.create_task(http.get(f"/v1/turns/{turn}", params={"wait": "50s"}))
        await _waiting(api, turn)

        # When the turn ends in this process (its end committed, then announced)
        await _end(pg_store, turn)
        api.endings.ended(turn)

        # Then the wait answers now (a missed wake-up would hold it for the rest of its 50 s)
        found = (await asyncio.wait_for(waiting, 10)).json()
        assert found["status"] == "completed"
        assert not api.endings.waiting(turn)  # nothing is kept for a wait that answered
        assert described == [turn]  # described once, as it answered; the looks read the row


async def test_a_wait_for_a_turn_that_ends_elsewhere_sees_it_at_its_next_look(pg_store: BrainStore) -> None:
    api = _api(pg_store, wait_poll=0.05)
    async with _http(api) as http:
        turn = (await http.post("/v1/sessions/s-2/turns", json=BODY)).json()["turn_id"]
        waiting = asyncio.create_task(http.get(f"/v1/turns/{turn}", params={"wait": "50s"}))
        await _waiting(api, turn)
        await _end(pg_store, turn)  # by another Brain: nobody here hears of it
        assert (await asyncio.wait_for(waiting, 10)).json()["status"] == "completed"
        # And a short wait for a turn that goes on answers with the turn as it stands
        other = (await http.post("/v1/sessions/s-3/turns", json=BODY)).json()["turn_id"]
        assert (await http.get(f"/v1/turns/{other}", params={"wait": "0.1"})).json()["status"] == "queued"


async def test_a_turn_that_ends_in_a_brains_commit_wakes_the_waits_of_that_brains_api(
    pg_store: BrainStore, tmp_path: Any
) -> None:
    async with LocalBroker(tmp_path / "queues.sqlite3", Topology("t")) as transport:
        ctx = _context(pg_store, transport)
        with ctx.endings.watch("turn-a") as a, ctx.endings.watch("turn-b") as b:
            ctx.ended("turn-a", "completed", None)
            assert a.is_set() and not b.is_set()
        assert not ctx.endings.waiting("turn-a")


async def _turn_of(store: BrainStore, request_id: str) -> str:
    """The id of the turn a request made, once its submit committed."""
    found: list[str] = []

    async def made() -> bool:
        async with store.pool.acquire() as conn:
            rows = await conn.fetch("SELECT id FROM turns WHERE request_id = $1", request_id)
        found[:] = [r["id"] for r in rows]
        return bool(found)

    await wait_for(made, timeout=10, interval=0.01, what="the submit to commit")
    return found[0]


async def test_a_submit_that_waits_answers_with_its_turn_once_the_turn_ends_here(
    pg_store: BrainStore,
) -> None:
    # Given an API whose waits look again only once a minute
    api = _api(pg_store, wait_poll=60.0)
    async with _http(api) as http:
        # When a client submits a turn and waits for it in the same request
        asking = asyncio.create_task(http.post("/v1/sessions/s-4/turns", json=BODY, params={"wait": "50s"}))
        turn = await _turn_of(pg_store, "r-1")
        await _waiting(api, turn)
        assert not asking.done()  # accepted, and waiting: not answered while the turn goes on

        # And the turn ends in this process
        await _end(pg_store, turn)
        api.endings.ended(turn)

        # Then that request answers now, with the turn as it ended
        answer = await asyncio.wait_for(asking, 10)
        assert answer.status_code == 201
        body = answer.json()
        assert (body["turn_id"], body["created"]) == (turn, True)
        assert body["turn"]["turn_id"] == turn and body["turn"]["status"] == "completed"
        assert body["turn"] == (await http.get(f"/v1/turns/{turn}")).json()  # as GET describes it
        assert not api.endings.waiting(turn)

        # And the same request again (a client that lost the answer) looks at the turn first:
        # answered at once (not after its 50 s, nor at a look a minute away), the original turn
        repeat = http.post("/v1/sessions/s-4/turns", json=BODY, params={"wait": "50s"})
        again = await asyncio.wait_for(repeat, 10)
        assert again.status_code == 200
        assert (again.json()["turn_id"], again.json()["created"]) == (turn, False)
        assert again.json()["turn"]["status"] == "completed"


async def test_a_submit_whose_wait_runs_out_answers_with_the_turn_as_it_stands_and_the_turn_goes_on(
    pg_store: BrainStore,
) -> None:
    api = _api(pg_store, wait_poll=0.05)
    async with _http(api) as http:
        # A turn that nothing runs here (no Brain claims it): the wait runs out
        answer = await http.post("/v1/sessions/s-5/turns", json=BODY, params={"wait": "0.2s"})
        assert answer.status_code == 201
        turn = answer.json()["turn_id"]
        assert answer.json()["turn"]["status"] == "queued"
        # Observers never change work: the turn is still there, queued, not cancelled
        assert (await http.get(f"/v1/turns/{turn}")).json()["status"] == "queued"
        # And without wait, the answer is as it always was: no turn in it
        plain = (await http.post("/v1/sessions/s-6/turns", json=BODY)).json()
        assert plain["created"] and plain.get("turn") is None


async def test_a_submit_with_a_wait_that_is_not_seconds_is_refused_and_accepts_nothing(
    pg_store: BrainStore,
) -> None:
    api = _api(pg_store, wait_poll=0.05)
    async with _http(api) as http:
        bad = await http.post("/v1/sessions/s-7/turns", json=BODY, params={"wait": "1m"})
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "schema_error"
        assert "wait takes seconds" in bad.json()["error"]["message"]
        # Nothing was accepted: the same request id makes its turn now
        assert (await http.post("/v1/sessions/s-7/turns", json=BODY)).json()["created"] is True


async def test_brain_wait_over_an_api_waits_there_and_hears_the_end_at_once(
    pg_store: BrainStore, capsys: Any
) -> None:
    # Given a Brain's API whose waits look again only once a minute, and `brain wait --url`
    api = _api(pg_store, wait_poll=60.0)
    async with serving(api, ("127.0.0.1", 0), required=True) as port, _http(api) as http:
        turn = (await http.post("/v1/sessions/s-1/turns", json=BODY)).json()["turn_id"]
        args = argparse.Namespace(turn_id=turn, url=f"http://127.0.0.1:{port}", timeout=60.0, json=True)
        waiting = asyncio.create_task(commands.wait(Settings(), args))
        # Then it waits in the Brain (a request that asks at once, again and again, never does)
        await _waiting(api, turn)

        # and when the turn ends there, it answers with it, done
        await _end(pg_store, turn)
        api.endings.ended(turn)
        assert await asyncio.wait_for(waiting, 10) == 0
        # (a wait too short to write in seconds is a wait of none, not a refused request)
        async with AsyncClient(args.url) as client:
            assert (await client.turn(turn, wait=1e-5))["status"] == "completed"
    assert '"status": "completed"' in capsys.readouterr().out
