"""The session stream's OpenAPI entry says it answers ``text/event-stream`` and gives the shape of
each event's data; the events a real stream sends fit those shapes, and the list of fact kinds it
publishes holds every kind the Brain writes."""

from __future__ import annotations

import ast
import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from brain.rules import facts
from brain.rules.facts import KINDS
from local.testing import LocalTendon, local_tendon
from tests.test_agui import GREETER

STREAM = "/v1/sessions/{session_id}/stream"


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalTendon]:
    async with local_tendon(tmp_path, "examples.hello_tools") as running:
        yield running


async def test_the_stream_route_publishes_its_media_type_and_every_event_fits_its_shape(
    local: LocalTendon,
) -> None:
    async with httpx.AsyncClient(base_url=local.url, timeout=30) as http:
        doc = (await http.get("/openapi.json")).json()
        answer = doc["paths"][STREAM]["get"]["responses"]["200"]["content"]
        assert list(answer) == ["text/event-stream"]
        shapes = {s["title"]: s for s in answer["text/event-stream"]["schema"]["anyOf"]}
        assert set(shapes) == {"StreamEntry", "StreamPreview", "StreamResync", "Fact"}

        turn_id = await local.submit(GREETER, "greet Ada", session="s-schema")
        await local.wait(turn_id)
        seen: list[tuple[str, Any]] = []
        async with http.stream("GET", STREAM.format(session_id="s-schema")) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            kind = ""
            async for line in response.aiter_lines():
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    seen.append((kind, json.loads(line[5:])))
                    if any(f["kind"] == "turn.completed" for f in seen[-1][1].get("facts", ())):
                        break
    for kind, data in seen:
        assert kind == "entry"
        jsonschema.validate(data, shapes["StreamEntry"])
        for fact in data["facts"]:
            jsonschema.validate(fact, shapes["Fact"])
            assert fact["kind"] in KINDS, fact["kind"]


def test_the_published_fact_kinds_hold_every_kind_the_fact_constructors_spell() -> None:
    source = Path(facts.__file__).read_text()
    spelled = {
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.count(".") == 1
        and node.value.split(".")[0] in ("turn", "execution", "control", "message", "thread")
        and " " not in node.value
        and not node.value.endswith(".")
    }  # fmt: skip
    assert spelled and spelled <= set(KINDS), spelled - set(KINDS)


async def test_a_pending_stream_waits_for_its_sessions_first_submit(local: LocalTendon) -> None:
    async with httpx.AsyncClient(base_url=local.url, timeout=30) as http:
        path = STREAM.format(session_id="s-later")
        # Without asking for it, a session with no turn yet is unknown
        assert (await http.get(path)).status_code == 404

        async def first_entry() -> dict[str, Any]:
            async with http.stream("GET", path, params={"pending": "true"}) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        return dict(json.loads(line[5:]))
            raise AssertionError("the stream ended")

        # A subscriber that joins before the session exists gets its first entry once it is made
        waiting = asyncio.create_task(first_entry())
        await asyncio.sleep(0.5)
        assert not waiting.done()
        await local.submit(GREETER, "greet Ada", session="s-later")
        entry = await asyncio.wait_for(waiting, 30)
    assert entry["session_id"] == "s-later" and entry["facts"][0]["kind"] == "turn.accepted"
