"""A submit refuses what can never run: an agent naming a tool no Hands pool has ever announced (a
misspelt name) or a model kind no Brain has, at once and before anything is written, saying what
may be named; a tool expected later (the submit's or the agent's ``expect_tools``) is taken, and a
tool that is known but that nobody serves right now is taken with a warning. The rule without
servers, the HTTP API on both backends, and `brain submit` as users run it (to the database, over
``TENDON_URL``, and to `brain serve --local`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from brain.api.app import Api, create_app
from brain.api.auth import Tokens
from brain.rules.admission import check_model, refusal, unknown_tools
from brain.rules.agents import AgentDefinition
from brain.store import BrainStore, open_store
from brain.verbs import KnownTools
from infra.transport import Topology
from infra.transport.localqueue import LocalBroker
from protocol import ReplayPolicy, SchemaError, ToolBinding, UnknownToolError
from tests.support import REPO, Processes, TendonEnv, free_port, run_cli
from tests.test_brain_store import store
from tests.test_console import local_server

__all__ = ["store"]  # the fixture, used by name

HELLO = "examples/hello_agent.json"

SEND = ToolBinding.build(
    name="send_email",
    version="1",
    route="email",
    input_schema={"type": "object"},
    replay_policy=ReplayPolicy.UNSAFE,
)


def agent(tools: list[str], kind: str = "scripted", **fields: Any) -> dict[str, Any]:
    model = {"kind": kind, "script": [{"content": "ok"}]}
    return {"name": "notice", "version": "1", "model": model, "tools": tools} | fields


# ---- the rule ----------------------------------------------------------------------------


def test_the_rule_refuses_only_tools_never_announced_and_not_expected() -> None:
    defined = AgentDefinition.model_validate(
        agent(["send_email", "send_emial", "later"], expect_tools=["later"], manual_tools=[{"name": "ask"}])
    )
    known = {"send_email", "lookup"}
    assert unknown_tools(defined, known, expect=False) == ["send_emial"]
    assert unknown_tools(defined, known, expect=True) == []
    error = refusal(defined, ["send_emial"], known, served_here=False)
    assert isinstance(error, UnknownToolError) and error.code == "unknown_tool"
    assert (error.unknown, error.known) == (["send_emial"], ["lookup", "send_email"])
    assert "send_emial" in error.message and "lookup, send_email" in error.message
    # A manual tool is answered by a person: no pool announces it, and none needs to
    manual = AgentDefinition.model_validate(agent(["ask"], manual_tools=[{"name": "ask"}]))
    assert unknown_tools(manual, set(), expect=False) == []


def test_a_model_kind_no_brain_has_is_refused_with_the_kinds_there_are() -> None:
    check_model(AgentDefinition.model_validate(agent([])))
    with pytest.raises(SchemaError, match=r"model kind 'scripted-v2'.*the kinds: scripted, openai"):
        check_model(AgentDefinition.model_validate(agent([], kind="scripted-v2")))


def test_an_agent_can_expect_only_tools_it_names() -> None:
    with pytest.raises(ValueError, match="expect_tools names other, which `tools` does not"):
        AgentDefinition.model_validate(agent(["send_email"], expect_tools=["other"]))


async def test_tools_seen_once_are_known_for_good_and_a_served_route_is_asked_once_a_second() -> None:
    class Untouchable:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the {name} was used")

    class Counting:
        asked = 0

        async def consumers(self, queue: str) -> int:
            self.asked += 1
            return 1

    # Given a process that saw send_email announced for route email
    known = KnownTools(routes={"send_email": frozenset({"email"})})
    defined = AgentDefinition.model_validate(agent(["send_email"]))
    broker = Counting()
    # When submits of it are admitted and checked for warnings, Then the store is never read,
    # and the broker is asked once while the route is served
    for _ in range(3):
        await known.admit(Untouchable(), defined)  # type: ignore[arg-type]
        assert await known.unserved(Untouchable(), broker, Topology("t"), defined) == []  # type: ignore[arg-type]
    assert broker.asked == 1


# ---- the HTTP API, on both backends -------------------------------------------------------


@pytest.fixture
async def api(store: BrainStore, tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, LocalBroker]]:
    """The API in process on ``store``, send_email announced for route email; its transport a
    local queue (whose consumers say who serves a route)."""
    await store.transact(lambda c: store.bindings.store_bindings(c, [SEND], "wake"))
    topology = Topology("t")
    async with LocalBroker(tmp_path / "queue.sqlite3", topology) as broker:
        tokens = Tokens("", "", "ns")
        served = Api(store=store, tokens=tokens, topology=topology, wake_channel="wake", transport=broker,
                     tools=KnownTools(grace=0.3))  # fmt: skip
        transport = httpx.ASGITransport(app=create_app(served))
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            yield http, broker


async def _post(
    http: httpx.AsyncClient, request: str, definition: dict[str, Any], **extra: Any
) -> httpx.Response:
    body = {"request_id": request, "input": "go", "agent": definition, **extra}
    return await http.post(f"/v1/sessions/s-{request}/turns", json=body)


async def _turns(store: BrainStore) -> int:
    return len(await store.read(lambda c: c.fetch("SELECT id FROM turns")))


async def test_the_api_refuses_a_tool_never_announced_and_takes_one_expected_later(
    api: tuple[httpx.AsyncClient, LocalBroker], store: BrainStore
) -> None:
    http, _ = api
    # When an agent names a misspelt tool, Then the submit is a 400 saying which, and what is known
    answer = await _post(http, "r1", agent(["send_emial"]))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "unknown_tool"
    assert "send_emial" in error["message"] and "announced: send_email" in error["message"]
    # And so is a model kind no Brain has (422, with the kinds there are); nothing was written
    answer = await _post(http, "r1", agent(["send_email"], kind="gpt"))
    assert answer.status_code == 422 and "the kinds: scripted, openai" in answer.json()["error"]["message"]
    assert await _turns(store) == 0

    # When the submit, or the agent, says the tool comes later, Then it is taken, with a warning
    for request, extra, definition in (
        ("r2", {"expect_tools": True}, agent(["later_tool"])),
        ("r3", {}, agent(["later_tool"], name="expecting", expect_tools=["later_tool"])),
    ):
        answer = await _post(http, request, definition, **extra)
        assert answer.status_code == 201, answer.text
        (warning,) = answer.json()["warnings"]
        assert warning.startswith("no Hands pool has announced later_tool; the turn waits for one")
    assert await _turns(store) == 2


async def test_the_api_warns_of_a_known_tool_nobody_serves_and_says_nothing_once_one_does(
    api: tuple[httpx.AsyncClient, LocalBroker], store: BrainStore
) -> None:
    http, broker = api
    # Given send_email known (announced for route email) but no worker on the route
    answer = await _post(http, "r1", agent(["send_email"]))
    assert answer.status_code == 201, answer.text
    assert answer.json()["warnings"] == [
        "no Hands pool serves route email (send_email) right now; its calls wait for one "
        "(start `hands serve --route email --tools MODULE`)"
    ]

    # When a worker consumes the route's commands, Then a submit answers without warnings
    async def handler(delivery: Any) -> None:
        return None

    consumer = await broker.consume(broker.topology.commands("email"), handler, prefetch=1)
    try:
        answer = await _post(http, "r2", agent(["send_email"]))
        assert answer.status_code == 201 and "warnings" not in answer.json(), answer.text
    finally:
        await consumer.close()


# ---- `brain submit`, as users run it --------------------------------------------------------


def _file(tmp_path: Path, name: str, definition: dict[str, Any]) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(definition))
    return str(path)


async def _submit(env: dict[str, str], path: str, request: str, *options: str) -> tuple[int, str, str]:
    args = ["-m", "brain", "submit", "--session", f"s-{request}", "--request-id", request, "--agent", path]
    return await run_cli([*args, *options, "go"], env)


async def test_brain_submit_refuses_a_misspelt_tool_with_exit_code_2_to_the_database_and_over_the_api(
    tendon: TendonEnv, processes: Processes, tmp_path: Path
) -> None:
    # Given a Brain serving its API, and send_email announced (no pool serves it right now)
    port = free_port()
    await processes.start_ready(
        "brain", ["-m", "brain", "serve"], {**tendon.env, "TENDON_HTTP": f"127.0.0.1:{port}"}
    )
    store = await open_store(tendon.settings())
    try:
        await store.transact(lambda c: store.bindings.store_bindings(c, [SEND], "wake"))
    finally:
        await store.close()
    remote = {**tendon.env, "TENDON_URL": f"http://127.0.0.1:{port}"}
    misspelt = _file(tmp_path, "misspelt", agent(["send_emial"], name="misspelt"))
    unknown_model = _file(tmp_path, "model", agent(["send_email"], kind="gpt"))
    right = _file(tmp_path, "right", agent(["send_email"]))

    # When a misspelt tool or an unknown model kind is submitted, to the database or over the API,
    # Then it is refused, exit code 2, in one line that says what may be named
    for env in (tendon.env, remote):
        code, out, err = await _submit(env, misspelt, "r1")
        assert (code, out) == (2, ""), err
        assert err.startswith(
            "brain: agent misspelt names tool(s) send_emial that no Hands pool has announced"
        )
        assert "(the tools Hands pools have announced: send_email)" in err and len(err.splitlines()) == 1
        code, out, err = await _submit(env, unknown_model, "r1")
        assert (code, out) == (2, "") and "model kind 'gpt'" in err, err

    # When the right tool is submitted over the API, Then it is taken, with the warning that
    # nobody serves its route right now; and a tool expected later is taken too
    code, out, err = await _submit(remote, right, "r2")
    assert code == 0 and out.startswith("turn-"), err
    assert err.startswith("brain: warning: no Hands pool serves route email (send_email) right now;"), err
    code, out, err = await _submit(remote, misspelt, "r3", "--expect-tools")
    assert code == 0 and out.startswith("turn-"), err
    assert err.startswith("brain: warning: no Hands pool has announced send_emial;"), err


async def test_a_local_server_refuses_a_tool_it_does_not_serve_at_once_listing_those_it_does(
    processes: Processes, tmp_path: Path
) -> None:
    # Given `brain serve --local` with the hello tools
    port = free_port()
    await local_server(processes, tmp_path, ["examples.hello_tools"], port)
    env = {"TENDON_URL": f"http://127.0.0.1:{port}"}
    hello = json.loads(await asyncio.to_thread((REPO / HELLO).read_text))
    misspelt = _file(tmp_path, "misspelt", {**hello, "tools": ["gret"]})

    # When its agent names a tool it does not serve, Then the submit is refused at once (the
    # server knows its pools: no wait for an announcement), listing the tools it serves
    started = time.monotonic()
    code, out, err = await _submit(env, misspelt, "r1")
    took = time.monotonic() - started
    assert (code, out) == (2, ""), err
    assert (
        "names tool(s) gret that no Hands pool has announced (the tools this server serves: count, greet"
        in err
    )
    print(f"refused in {took:.2f}s, the CLI's start included")

    # And the agent as written is taken, without a warning (its pool serves in the process)
    code, out, err = await _submit(env, str(REPO / HELLO), "r2")
    assert code == 0 and out.startswith("turn-") and err == "", err
