"""The submit route reads its own arguments (brain/api/routes.py says why): what it refuses, and
what the OpenAPI document says of it, must be what a declared signature gave. Served in process
(httpx's ASGI transport): every request here is refused or answered before the store is used."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel

from brain.api import hash_token
from brain.api.app import Api, create_app
from brain.api.auth import Tokens
from brain.api.models import SubmitRequest, inlined, parsed
from tests.test_api import TOOL_THEN_DONE

PATH = "/v1/sessions/s1/turns"


class Store:
    """A store no request here may reach."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the store was used ({name}) by a request that should have been refused")


def app_client(**headers: str) -> httpx.AsyncClient:
    tokens = Tokens(f"acme:{hash_token('secret')}", "", "default")
    api = Api(store=Store(), tokens=tokens, topology=None, wake_channel="w")  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=create_app(api))
    return httpx.AsyncClient(transport=transport, base_url="http://api", headers=headers)


def refs_in(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if "$ref" in node else []
        return own + [r for value in node.values() for r in refs_in(value)]
    if isinstance(node, list):
        return [r for item in node for r in refs_in(item)]
    return []


async def test_the_submit_is_documented_as_its_declared_signature_was() -> None:
    async with app_client() as http:
        doc = (await http.get("/openapi.json")).json()
    operation = doc["paths"]["/v1/sessions/{session_id}/turns"]["post"]
    params = {(p["name"], p["in"]): p["required"] for p in operation["parameters"]}
    assert params == {("session_id", "path"): True, ("wait", "query"): False}
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert set(body["required"]) == {"request_id", "input", "agent"}
    assert body["properties"]["agent"]["properties"]["tools"]["type"] == "array"
    # Every reference in the document points at a component it has (none dangles).
    components = {f"#/components/schemas/{name}" for name in doc["components"]["schemas"]}
    assert set(refs_in(doc)) <= components
    assert {"201", "200"} <= set(operation["responses"])
    assert operation["responses"]["201"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Submitted"
    }


@pytest.mark.parametrize(
    ("body", "code", "where"),
    [
        ({"request_id": "r1", "input": "go"}, "schema_error", "body.agent: Field required"),
        ({"request_id": "", "input": "go", "agent": TOOL_THEN_DONE}, "schema_error", "body.request_id: "),
        (
            {"request_id": "r1", "input": "go", "agent": TOOL_THEN_DONE, "extra": 1},
            "schema_error",
            "body.extra: ",
        ),
        (
            {"request_id": "r1", "input": "go", "agent": {**TOOL_THEN_DONE, "tools": 5}},
            "schema_error",
            "body.agent.tools: ",
        ),
        ("not json", "decode_error", "body: malformed JSON: Expecting value"),
        ("", "decode_error", "body: malformed JSON: Expecting value"),
        ('{"request_id": "r1", "request_id": "r2"}', "decode_error", "body: duplicate JSON key 'request_id'"),
    ],
)
async def test_a_bad_submit_body_is_refused_saying_where(body: Any, code: str, where: str) -> None:
    async with app_client(authorization="Bearer secret") as http:
        raw = body if isinstance(body, str) else json.dumps(body)
        answer = await http.post(PATH, content=raw, headers={"content-type": "application/json"})
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == code and error["message"].startswith(where), error


async def test_a_submit_is_refused_for_its_caller_first_then_for_its_wait() -> None:
    good = {"request_id": "r1", "input": "go", "agent": TOOL_THEN_DONE}
    async with app_client() as anonymous:
        # no token: 401, whatever the body (it is not read)
        assert (await anonymous.post(PATH, json={"bad": 1})).status_code == 401
    async with app_client(authorization="Bearer wrong") as stranger:
        assert (await stranger.post(PATH, json=good)).status_code == 401
    async with app_client(authorization="Bearer secret") as http:
        bad_wait = await http.post(PATH, json=good, params={"wait": "soon"})
    assert bad_wait.status_code == 422 and "wait takes seconds" in bad_wait.json()["error"]["message"]


def test_a_body_is_read_as_its_model_and_refused_with_the_place_of_each_error() -> None:
    body = {"request_id": "r1", "input": "go", "agent": TOOL_THEN_DONE}
    assert parsed(SubmitRequest, body).agent.name == "api-agent"
    with pytest.raises(RequestValidationError) as refused:
        parsed(SubmitRequest, {"request_id": 5, "input": "go"})
    assert sorted(e["loc"] for e in refused.value.errors()) == [("body", "agent"), ("body", "request_id")]


class Node(BaseModel):
    children: list[Node] = []


def test_a_schema_is_inlined_whole_and_a_model_that_refers_to_itself_is_refused() -> None:
    schema = inlined(SubmitRequest)
    assert refs_in(schema) == [] and "$defs" not in schema
    assert schema["properties"]["agent"]["properties"]["name"]["type"] == "string"
    with pytest.raises(TypeError, match="refers to itself"):
        inlined(Node)


@pytest.mark.parametrize("text", ["a\\u0000b", "a\\ud800b"])
async def test_a_definition_with_text_the_record_cannot_store_is_refused_before_the_store(text: str) -> None:
    agent = json.dumps({**TOOL_THEN_DONE, "instructions": "PLACE"}).replace("PLACE", text)
    raw = f'{{"request_id": "r1", "input": "go", "agent": {agent}}}'
    async with app_client(authorization="Bearer secret") as http:
        answer = await http.post(PATH, content=raw, headers={"content-type": "application/json"})
    assert answer.status_code == 422 and answer.json()["error"]["code"] == "schema_error", answer.text
