"""The rules of ids and names (``brain.rules.names``): what each may hold and how long it may be,
the same for the HTTP API, the CLI and an agent definition; and the settings' warning about a
``TENDON_*`` variable that is no setting."""

from __future__ import annotations

import re

import pytest
from pydantic import BaseModel, ValidationError

from brain.rules.agents import AgentDefinition
from brain.rules.names import (
    MAX_ID,
    MAX_SESSION_ID,
    RequestId,
    check_id,
    check_thread_name,
    id_problem,
    shown,
)
from infra.process.settings import unknown_variables
from protocol import SchemaError

SPEC = {"name": "a", "version": "1", "model": {"kind": "scripted"}}


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "is empty"),
        ("a\x00b", "holds a control character (U+0000) at character 2"),
        ("\x1b", "holds a control character (U+001B) at character 1"),
        ("ab\n", "holds a control character (U+000A) at character 3"),
        ("a\x7f", "holds a control character (U+007F) at character 2"),
        ("a\x85", "holds a control character (U+0085) at character 2"),
        ("a\ud800", "holds a lone surrogate (U+D800) at character 2"),
        ("x" * 201, "is 201 characters long: at most 200"),
        ("x" * 10_000, "is 10,000 characters long: at most 200"),
    ],
)
def test_an_id_with_a_control_character_or_too_long_is_refused_saying_why(value: str, problem: str) -> None:
    assert id_problem(value, MAX_ID) == problem
    with pytest.raises(SchemaError) as refused:
        check_id("session id", value, MAX_SESSION_ID)
    assert refused.value.message == f"session id {shown(value)} {problem}"
    assert len(refused.value.message) < 150 and "\n" not in refused.value.message


@pytest.mark.parametrize("value", ["s1", "x" * 200, "²", "é-ü", "a b", "a/b", "turn-0123abcd", "\ufffd"])
def test_an_id_of_printable_text_within_its_length_is_taken(value: str) -> None:
    assert id_problem(value, MAX_ID) is None
    check_id("turn id", value, MAX_ID)


def test_a_thread_name_is_the_whole_of_it_never_a_name_and_a_newline() -> None:
    for good in ("main", "a", "x" * 64, "side-1.b_c"):
        check_thread_name(good)
    for bad in ("main\n", "", "-a", "x" * 65, "a b", "a/b", "²", "a\x00"):
        with pytest.raises(SchemaError, match="is not valid: 1 to 64 letters"):
            check_thread_name(bad)


def test_a_body_field_takes_the_same_rule_and_the_schema_says_its_length() -> None:
    class Body(BaseModel):
        request_id: RequestId

    assert Body(request_id="r-1").request_id == "r-1"
    for bad, words in (
        ("a\x00b", "holds a control character (U+0000)"),
        ("x" * 201, "at most 200 characters"),
    ):
        with pytest.raises(ValidationError, match=re.escape(words)):
            Body(request_id=bad)
    schema = Body.model_json_schema()["properties"]["request_id"]
    assert (schema["minLength"], schema["maxLength"]) == (1, 200)


def test_an_agents_name_and_version_are_ids_and_a_local_server_leaves_room_for_its_digest() -> None:
    for field in ("name", "version"):
        for bad in ("x" * 201, "a\x1bb", "1\n", ""):
            with pytest.raises(ValidationError):
                AgentDefinition.model_validate({**SPEC, field: bad})
    # A version of 187 characters is one of 200 once a local development server added its digest
    longest = AgentDefinition.model_validate({**SPEC, "version": "v" * 187}).versioned_by_content()
    assert len(longest.version) == 200
    with pytest.raises(SchemaError, match="too long for a local development server.*at most 187"):
        AgentDefinition.model_validate({**SPEC, "version": "v" * 188}).versioned_by_content()


def test_a_tendon_variable_that_is_no_setting_is_named_with_the_setting_meant() -> None:
    environ = {
        "TENDON_CONCURENCY": "4",
        "TENDON_DATABASE_URI": "x",
        "TENDON_NOTHING_LIKE_IT": "1",
        "TENDON_CONCURRENCY": "4",  # a setting
        "tendon_log_level": "INFO",  # a setting, as pydantic reads it (any case)
        "TENDON_MAILBOX_URL": "x",  # the example tools'
        "TENDON_TEST_DATABASE_URL": "x",  # the test suite's
        "PATH": "/bin",
    }
    assert unknown_variables(environ) == [
        "TENDON_CONCURENCY is not a Tendon setting (did you mean TENDON_CONCURRENCY?): it is ignored",
        "TENDON_DATABASE_URI is not a Tendon setting (did you mean TENDON_DATABASE_URL?): it is ignored",
        "TENDON_NOTHING_LIKE_IT is not a Tendon setting: it is ignored",
    ]
