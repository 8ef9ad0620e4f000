"""Pydantic AI and OpenAI Agents SDK tools served by a Hands pool: discovery, policies, running.

No services here: the bindings, the policies and the calls are checked in this process, against
the frameworks themselves (the tool definitions a model is given, the context a tool gets).
"""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from agents.models.chatcmpl_converter import Converter
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from hands.tools.declare import ToolContext
from hands.tools.registry import ToolLoadError, declared_routes, load_tools
from protocol import SchemaError, is_content_version
from tests import framework_agents as lab
from tests.support import REPO

MODULE = "tests.framework_agents"


def served(route: str = "fw") -> dict[str, Any]:
    return {t.name: t for t in load_tools(MODULE, route).tools}


async def call(name: str, args: dict[str, Any], operation_id: str = "op-1") -> Any:
    tool = served()[name]
    return await tool.fn(ToolContext(operation_id=operation_id), **tool.validate_args(args))


def test_pydantic_ai_tools_are_bound_with_the_definitions_the_model_is_given() -> None:
    # Given the tool definitions Pydantic AI itself hands a model in a run of the agent
    shown: dict[str, Any] = {}

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        shown.update({t.name: t for t in info.function_tools})
        return ModelResponse(parts=[TextPart("ok")])

    lab.lab.run_sync("hi", model=FunctionModel(model))
    # Then every binding carries exactly that name, description and JSON Schema
    bindings = {**served("fw"), **served("agents")}
    assert {n for n, t in bindings.items() if t.framework == "pydantic-ai"} == {*shown, "spare_tool"}
    assert "geo_area" in shown, "a prefixed toolset's tool is served under the name the model calls"
    for name, definition in shown.items():
        binding = bindings[name].binding
        assert binding.input_schema == definition.parameters_json_schema
        assert binding.description == definition.description


def test_agents_sdk_tools_are_bound_with_the_definitions_the_model_is_given() -> None:
    bindings = {**served("fw"), **served("other")}
    for tool in [t for t in lab.sdk.tools if t.name != "ask_helper"]:  # an agent: not served
        sent = Converter.tool_to_openai(tool)["function"]  # what a chat-completions model is sent
        binding = bindings[tool.name].binding
        assert binding.input_schema == sent["parameters"] == tool.params_json_schema
        assert binding.description == sent["description"]


def test_policies_come_from_the_decorator_or_the_mapping_with_unsafe_and_a_module_route_by_default() -> None:
    fw = served("fw")
    pydantic_ai = ["effect", "geo_area", "lookup", "peek", "refund", "verified", "wait_long"]
    agents_sdk = ["sdk_boom", "sdk_effect", "sdk_handled", "sdk_lookup", "sdk_refund"]
    assert sorted(fw) == sorted(pydantic_ai + agents_sdk)
    policy = {n: (t.binding.replay_policy.value, t.binding.has_query) for n, t in fw.items()}
    assert policy["effect"] == ("unsafe", False) and policy["verified"] == ("unsafe", True)
    assert policy["lookup"] == ("safe", False) and policy["sdk_lookup"] == ("safe", False)
    assert policy["sdk_boom"] == ("unsafe", False), "a mapping entry without replay is unsafe"
    assert fw["lookup"].binding.version == "7"
    # The framework's own "ask a person first" is the binding's, unless the policy says otherwise.
    asks = sorted(n for n, t in fw.items() if t.binding.requires_approval)
    assert asks == ["refund", "sdk_refund"]
    assert fw["effect"].binding.version.startswith("pydantic-ai-")
    assert fw["sdk_effect"].binding.version.startswith("openai-agents-")
    # a digest: the Brain takes the one announced later as the newer (protocol.is_content_version)
    assert is_content_version(fw["effect"].binding.version)
    assert is_content_version(fw["sdk_effect"].binding.version)
    # A tool without a policy is unsafe on the default route; a tool of another route is not served here.
    unrouted = load_tools(MODULE, "agents").tools
    assert [t.name for t in unrouted] == ["history", "spare_tool"]
    assert {t.binding.replay_policy.value for t in unrouted} == {"unsafe"}
    assert [t.name for t in load_tools(MODULE, "other").tools] == ["sdk_elsewhere"]
    assert declared_routes(MODULE) == ["agents", "fw", "other"]
    everywhere = [t.name for r in declared_routes(MODULE) for t in load_tools(MODULE, r).tools]
    assert "ask_helper" not in everywhere, "an agent used as a tool asks a model: the Brain's work"


def test_a_decorator_with_a_replay_policy_that_is_none_fails_at_import() -> None:
    from hands.tools.declare import policy

    with pytest.raises(ValueError, match="policy\\(replay='sometimes'\\): replay is 'safe' or 'unsafe'"):
        policy(replay="sometimes")


def test_a_changed_tool_is_a_new_binding_and_the_same_one_binds_the_same_way() -> None:
    assert served()["effect"].binding.digest == served()["effect"].binding.digest
    assert served()["effect"].binding.digest != served()["verified"].binding.digest


async def test_a_pydantic_ai_tool_runs_with_the_operation_id_and_returns_what_the_model_would_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FW_TEST_LOG", str(tmp_path / "log.jsonl"))
    assert await call("effect", {"key": "a"}) == {"key": "a", "done": "yes"}
    assert await call("geo_area", {"width": 2, "height": 3.5}) == 7.0, "through the prefixing wrapper"
    # A RunContext tool (sync: run in a thread) gets the operation id as its tool_call_id.
    assert await call("lookup", {"key": "b"}, "op-2") == {"key": "b", "value": "B"}
    (seen,) = lab.noted("lookup")
    assert seen == {"tool": "lookup", "key": "b", "op": "op-2", "call": "op-2", "deps": None}
    # What the Brain's run holds is not here, and the error says so.
    with pytest.raises(Exception, match="RunContext.messages is not available to a Pydantic AI tool run by"):
        await call("peek", {})
    with pytest.raises(SchemaError, match="arguments for tool 'effect' are invalid: key"):
        served()["effect"].validate_args({"key": 3})


async def test_an_agents_sdk_tool_gets_a_tool_context_and_its_errors_fail_the_execution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FW_TEST_LOG", str(tmp_path / "log.jsonl"))
    assert await call("sdk_effect", {"key": "a"}) == {"key": "a", "done": "yes"}
    # A value that is not JSON travels as the text the SDK would send the model.
    assert await call("sdk_lookup", {"key": "b"}, "op-3") == str(lab.Answer(key="b", value="B"))
    assert lab.noted("sdk_lookup") == [{"tool": "sdk_lookup", "key": "b", "op": "op-3", "name": "sdk_lookup"}]
    with pytest.raises(ValueError, match="boom: no"):
        await call("sdk_boom", {"reason": "no"})
    assert await call("sdk_handled", {"reason": "no"}) == "handled: no", "its own failure text is its result"
    with pytest.raises(SchemaError, match="'reason' is a required property"):
        served()["sdk_boom"].validate_args({})


async def test_a_cancel_interrupts_a_framework_tool_that_cannot_watch_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FW_TEST_LOG", str(tmp_path / "log.jsonl"))
    ctx = ToolContext(operation_id="op-c")
    running = asyncio.create_task(served()["wait_long"].fn(ctx, seconds=30))
    for _ in range(500):  # until the body runs
        if lab.noted("wait_long"):
            break
        await asyncio.sleep(0.01)
    ctx.cancelled.set()
    with pytest.raises(asyncio.CancelledError, match="wait_long was interrupted"):
        await asyncio.wait_for(running, 5)


BAD = {
    "unknown tool": ('TENDON_TOOLS = {"nope": {}}', "TENDON_TOOLS['nope'] in {m}: no agent in the module"),
    "bad replay": ('TENDON_TOOLS = {"send": {"replay": "maybe"}}', "replay: Input should be 'safe' or"),
    "unknown key": ('TENDON_TOOLS = {"send": {"rout": "x"}}', "rout: Extra inputs are not permitted"),
    "bad route": ('TENDON_TOOLS = {"send": {"route": "Mail Box"}}', "route: String should match pattern"),
    "missing query": (
        'TENDON_TOOLS = {"send": {"query": "was_sent"}}',
        "query 'was_sent' is not a function of the module",
    ),
    "safe with a query": (
        'async def q(ctx, to): ...\nTENDON_TOOLS = {"send": {"replay": "safe", "query": "q"}}',
        "tool send in {m}: a query is for unsafe tools",
    ),
    "sync query": (
        'def q(ctx, to): ...\nTENDON_TOOLS = {"send": {"query": q}}',
        "its query must be an async function",
    ),
    "both": (
        'policy(route="a")(send)\nTENDON_TOOLS = {"send": {}}',
        "a policy from both @policy and TENDON_TOOLS",
    ),
    "not a dict": ('TENDON_TOOLS = ["send"]', "TENDON_TOOLS in {m} must be a dict"),
}


def bad_module(tmp_path: Path, case: str) -> str:
    text = textwrap.dedent(
        """
        from pydantic_ai import Agent
        from hands.tools.declare import policy
        agent = Agent("test")

        @agent.tool_plain
        async def send(to: str) -> str:
            return to
        """
    )
    path = tmp_path / "bad_tools.py"
    path.write_text(text + BAD[case][0] + "\n")
    return str(path)


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_policy_that_cannot_be_served_is_refused_with_one_line(tmp_path: Path, case: str) -> None:
    spec = bad_module(tmp_path, case)
    with pytest.raises(ToolLoadError) as caught:
        load_tools(spec, "agents")
    assert BAD[case][1].format(m=spec) in caught.value.message
    assert "\n" not in caught.value.message


def test_hands_serve_refuses_a_bad_mapping_at_start_in_one_line(tmp_path: Path) -> None:
    import subprocess

    spec = bad_module(tmp_path, "bad replay")
    done = subprocess.run(
        [sys.executable, "-m", "hands", "serve", "--route", "agents", "--tools", spec],
        cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith(f"hands: TENDON_TOOLS['send'] in {spec}: replay: Input should be")
    assert done.stderr.count("\n") == 1


async def test_the_embedded_mode_serves_framework_tools_on_their_routes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from local.testing import local_tendon

    monkeypatch.setenv("FW_TEST_LOG", str(tmp_path / "log.jsonl"))
    calls = [("lookup", {"key": "a"}), ("sdk_effect", {"key": "b"}), ("sdk_boom", {"reason": "r"})]
    script: list[dict[str, Any]] = [{"tool_calls": [{"tool": t, "args": a}]} for t, a in calls]
    model = {"kind": "scripted", "script": [*script, {"content": "Done"}]}
    user = {"name": "fw-local", "version": "1", "model": model, "tools": [t for t, _ in calls]}
    async with local_tendon(tmp_path, MODULE) as tendon:
        turn = await tendon.run(user, "Go")
    assert turn["status"] == "completed"
    lookup, effect, boom = turn["executions"]
    assert (lookup["status"], lookup["result"]) == ("succeeded", {"key": "a", "value": "A"})
    assert (effect["status"], effect["result"]) == ("succeeded", {"key": "b", "done": "yes"})
    assert boom["status"] == "failed" and boom["error"]["message"] == "ValueError: boom: r"
    assert [r["op"] for r in lab.noted("sdk_effect")] == [effect["id"]]


@pytest.mark.parametrize("missing, extra", [("pydantic_ai", "pydantic-ai"), ("agents", "openai-agents")])
def test_a_module_whose_framework_is_not_installed_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str, extra: str
) -> None:
    # As Python says it when the framework is absent (both are installed here)
    text = f"raise ModuleNotFoundError(\"No module named '{missing}'\", name={missing!r})\n"
    (tmp_path / "needs_framework.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    told = rf"install the {extra} extra: pip install 'tendon\[{extra}\]'"
    for spec in ("needs_framework", str(tmp_path / "needs_framework.py")):
        with pytest.raises(ToolLoadError, match=told):
            load_tools(spec, "agents")


def test_a_toolset_that_cannot_be_listed_stops_the_pool_with_one_line(tmp_path: Path) -> None:
    # Given a tool whose prepare function reads what a pool does not have (the run's messages)
    path = tmp_path / "unlistable.py"
    path.write_text(
        textwrap.dedent(
            """
            from pydantic_ai import Agent, Tool

            async def only_late(ctx, definition):
                return definition if ctx.messages else None

            async def send(to: str) -> str:
                return to

            agent = Agent("test", tools=[Tool(send, prepare=only_late)])
            """
        )
    )
    with pytest.raises(ToolLoadError) as caught:
        load_tools(str(path), "agents")
    assert caught.value.message.startswith("Pydantic AI could not list the tools of ")
    assert "RunContext.messages is not available" in caught.value.message
    assert "\n" not in caught.value.message


async def test_a_module_gives_its_tools_a_default_route_and_deps(tmp_path: Path) -> None:
    # Given a module that names its default route and makes the deps its tools get
    path = tmp_path / "with_deps.py"
    path.write_text(
        textwrap.dedent(
            """
            from agents import Agent as SdkAgent, function_tool
            from agents.tool_context import ToolContext
            from pydantic_ai import Agent, RunContext

            TENDON_ROUTE = "billing"

            async def TENDON_DEPS():
                return {"tenant": "acme"}

            agent = Agent("test")

            @agent.tool
            def tenant(ctx: RunContext[dict]) -> str:
                return ctx.deps["tenant"]

            @function_tool
            def sdk_tenant(ctx: ToolContext[dict]) -> str:
                return ctx.context["tenant"] + ":" + ctx.tool_call_id

            sdk = SdkAgent(name="s", tools=[sdk_tenant])
            """
        )
    )
    registry = load_tools(str(path), "billing")
    assert registry.names == ["sdk_tenant", "tenant"]
    ctx = ToolContext(operation_id="op-d")
    assert await registry.get("tenant").fn(ctx) == "acme"  # type: ignore[union-attr]
    assert await registry.get("sdk_tenant").fn(ctx) == "acme:op-d"  # type: ignore[union-attr]
