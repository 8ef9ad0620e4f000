"""The rules of real agents, without servers: which tool calls the Brain refuses itself, the retry
policy, agent definitions and their digests, the crash-loop message, where a refused call goes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from brain.rules import moves
from brain.rules.agents import AgentDefinition
from brain.rules.calls import refusal
from brain.rules.retry import RetryPolicy
from brain.rules.states import TurnPhase, TurnStatus
from brain.run.claims import crash_loop
from brain.run.threads import FrozenThreads
from brain.store import Intent, TurnRow
from protocol import DecodeError, SchemaError, digest

BINDINGS = {
    "send_email": {
        "name": "send_email",
        "input_schema": {
            "type": "object",
            "properties": {"to": {"type": "string"}, "cc": {"type": "array", "items": {"type": "string"}}},
            "required": ["to"],
            "additionalProperties": False,
        },
    }
}


def call(tool: str = "send_email", args: Any = None, error: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"call_id": "c1", "tool": tool, "args": {"to": "a@b"} if args is None else args}
    return found | ({"error": error} if error else {})


def test_a_call_that_fits_its_tool_is_not_refused() -> None:
    assert refusal(call(), BINDINGS) is None
    assert refusal(call(args={"to": "a", "cc": ["b", "c"]}), BINDINGS) is None


@pytest.mark.parametrize(
    ("made", "why"),
    [
        (call(tool="send_fax"), "there is no tool named 'send_fax' (the tools are: send_email)"),
        (call(args={}), "do not fit the tool's schema: 'to' is a required property"),
        (call(args={"to": 5}), "schema at to: 5 is not of type 'string'"),
        (call(args={"to": "a", "cc": ["b", 7]}), "schema at cc/1: 7 is not of type 'string'"),
        (call(args={"to": "a", "bcc": "x"}), "Additional properties are not allowed"),
        (call(error="the arguments are not valid JSON: Expecting value"), "not valid JSON"),
    ],
)
def test_a_call_the_brain_can_tell_is_wrong_is_refused_saying_why(made: dict[str, Any], why: str) -> None:
    assert why in (refusal(made, BINDINGS) or "")


def test_retries_back_off_from_one_second_to_thirty_three_times_and_honour_what_the_api_asked() -> None:
    policy = RetryPolicy()
    assert [policy.delay(n) for n in (1, 2, 3, 4, 5, 6)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0]
    assert not policy.exhausted(3) and policy.exhausted(4)
    assert policy.delay(1, asked=7.0) == 7.0  # a 429's Retry-After, even past the cap
    assert policy.delay(3, asked=0.5) == 4.0


def test_an_agent_may_set_its_own_retry_policy_and_limits() -> None:
    agent = AgentDefinition.model_validate(
        {
            "name": "a",
            "version": "1",
            "model": {"kind": "scripted", "script": [{"content": "hi"}]},
            "retry": {"max_retries": 5, "initial": 0.5},
            "limits": {"max_model_calls": 3, "max_tool_calls": 4, "max_crashes": 2},
        }
    )
    assert (agent.retry.max_retries, agent.retry.initial, agent.retry.maximum) == (5, 0.5, 30.0)
    assert (agent.limits.max_tool_calls, agent.limits.max_crashes) == (4, 2)


def test_a_definition_written_before_the_new_fields_keeps_its_digest() -> None:
    # What a definition without retry, approvals, max_tool_calls and max_crashes hashed to before
    old = {
        "name": "a",
        "version": "1",
        "instructions": "",
        "model": {"kind": "scripted", "script": []},
        "tools": ["t"],
        "limits": {"max_model_calls": 50},
    }
    assert AgentDefinition.model_validate(old).digest == digest(old)
    changed = AgentDefinition.model_validate({**old, "retry": {"max_retries": 1}})
    assert changed.digest != digest(old)


def test_a_definitions_digest_and_stored_form_are_made_once_for_its_content_and_only_for_it() -> None:
    spec = {"name": "kept", "version": "1", "model": {"kind": "scripted", "t": 0.5}, "tools": ["t"]}
    first, again = AgentDefinition.model_validate(spec), AgentDefinition.model_validate(spec)
    assert first.stored == first.model_dump(mode="json") and first.stored is again.stored
    assert first.digest == again.digest
    # Any other content is another definition, however its JSON reads: an infinity is not the
    # null of another (the stored form refuses it, as the codec refuses it: bad input, not a crash)
    other = AgentDefinition.model_validate({**spec, "model": {"kind": "scripted", "t": 0.25}})
    assert other.digest != first.digest and other.stored["model"]["t"] == 0.25
    for where in ("model", "manual_tools"):
        assert AgentDefinition.model_validate(_with(spec, where, None)).digest
        with pytest.raises(DecodeError, match="NaN and Infinity are not JSON"):
            AgentDefinition.model_validate(_with(spec, where, float("inf"))).digest  # noqa: B018
    with pytest.raises(DecodeError, match="NaN and Infinity are not JSON"):
        AgentDefinition.model_validate({**spec, "retry": {"maximum": float("inf")}}).digest  # noqa: B018


def test_a_definition_the_record_cannot_store_says_why_and_has_no_stored_form() -> None:
    spec = {"name": "odd", "version": "1", "model": {"kind": "scripted"}}
    assert AgentDefinition.model_validate(spec).unstorable is None
    for text, why in (("a\x00b", "NUL"), ("a\ud800b", "lone surrogate")):
        odd = AgentDefinition.model_validate({**spec, "instructions": text})
        assert odd.unstorable is not None and why in odd.unstorable
        for form in ("digest", "stored"):
            with pytest.raises(SchemaError, match="agent odd cannot be stored"):
                getattr(odd, form)


def _with(spec: dict[str, Any], where: str, value: Any) -> dict[str, Any]:
    """``spec`` with ``value`` in a place of its model settings or of a manual tool's schema."""
    if where == "model":
        return {**spec, "model": {"kind": "scripted", "t": value}}
    return {**spec, "manual_tools": [{"name": "m", "input_schema": {"x": value}}]}


def _row(**values: Any) -> TurnRow:
    fields: dict[str, Any] = dict(
        id="t1", namespace="n", session_id="s", thread_id="s", request_id="r", status=TurnStatus.RUNNING,
        phase=TurnPhase.MODEL_REQUEST, revision=3, lease_owner="b1", lease_epoch=2, waiting_for=None,
        model_calls=1, tool_step=1, retries=0, runs=2, result=None, error=None, created_at=datetime.now(UTC),
    )  # fmt: skip
    return TurnRow(**(fields | values))


def test_a_crash_loop_says_where_the_brains_keep_dying() -> None:
    row = _row(crashes=3, crash_at="model_request#1#1")
    assert crash_loop(row) == (
        "its Brain died 3 times in a row at phase model_request (model call 2); "
        "it is failed instead of being run again"
    )
    assert "phase wait_tools (tool step 4)" in crash_loop(_row(crashes=3, crash_at="wait_tools#2#4"))


def _intent(status: str = "intended", awaits: str | None = None, call_id: str = "c1") -> Intent:
    return Intent(
        execution_id=f"e-{call_id}", tool_step=2, call_id=call_id, route="r", tool="send_email",
        binding_digest="d", replay_policy="unsafe", request_digest="-", command_message_id="m", command=None,
        queue="q", status=status, awaits=awaits,
        error={"code": "invalid_tool_call", "message": "no"} if status == "failed" else None,
    )  # fmt: skip


def test_a_reply_whose_every_call_was_refused_goes_back_to_the_model_at_once() -> None:
    message = {"text": None, "tool_calls": [call()]}
    move = moves.reply(_row(), message, {}, intents=[_intent("failed")], first_look=1.0)
    assert (move.status, move.phase, move.release) == (TurnStatus.RUNNING, TurnPhase.MODEL_REQUEST, False)
    kinds = [f["kind"] for f in move.facts]
    assert kinds == ["turn.model_replied", "execution.intended", "execution.failed", "turn.results_applied"]
    # with one call sent, the turn waits for it as usual
    waiting = moves.reply(_row(), message, {}, intents=[_intent(), _intent("failed")], first_look=1.0)
    assert (waiting.status, waiting.phase, waiting.release) == (
        TurnStatus.WAITING,
        TurnPhase.WAIT_TOOLS,
        True,
    )


def test_a_call_that_waits_for_a_person_is_journaled_pending_not_failed() -> None:
    # Given a reply whose calls wait for an approval and for a manual tool's result, beside one
    # sent at once and one the Brain refused
    calls = [call(), call(), call(), call()]
    intents = [
        _intent("pending", awaits="approval", call_id="c1"),
        _intent("pending", awaits="result", call_id="c2"),
        _intent(call_id="c3"),
        _intent("failed", call_id="c4"),
    ]
    for move in (
        moves.reply(_row(), {"text": None, "tool_calls": calls}, {}, intents=intents, first_look=1.0),
        moves.dispatch(_row(phase=TurnPhase.DISPATCH_TOOLS), intents, first_look=1.0),
    ):
        # Then only the refused one failed; the other two are pending, saying for what
        said = [(f["kind"], f.get("call_id"), f.get("how"), f.get("awaits")) for f in move.facts]
        outcomes = [s for s in said if s[0] not in ("execution.intended", "turn.model_replied")]
        assert outcomes == [
            ("execution.pending", "c1", None, "approval"),
            ("execution.pending", "c2", None, "result"),
            ("execution.failed", "c4", "rejected", None),
        ]
        assert move.waiting_for == (
            "1 tool execution(s); approval of send_email c1; a person's result for send_email c2"
        )


# ---- controls: what each does to a turn in each state (a pure table) ------------------------


def _view(status: TurnStatus = TurnStatus.RUNNING, **changes: Any) -> Any:
    from brain.rules.controls import TurnView

    fields: dict[str, Any] = dict(
        status=status, leased=False, revision=4, accepted_executions=0, cancelling=False, pause_pending=False
    )
    return TurnView(**(fields | changes))


@pytest.mark.parametrize("kind", ["steer", "inject", "pause", "resume", "cancel"])
@pytest.mark.parametrize("status", [TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.CANCELLED])
def test_a_control_on_a_turn_that_ended_is_rejected_saying_so(kind: str, status: TurnStatus) -> None:
    from brain.rules.controls import Kind, Outcome, decide

    assert decide(Kind(kind), _view(status), {"revision": 4}) == (
        Outcome.REJECT,
        f"the turn is {status} already",
    )


def test_steers_and_injects_wait_for_the_next_boundary_whatever_the_turn_does() -> None:
    from brain.rules.controls import Kind, Outcome, decide

    for status in (TurnStatus.QUEUED, TurnStatus.RUNNING, TurnStatus.WAITING, TurnStatus.PAUSED):
        for leased in (False, True):
            assert decide(Kind.STEER, _view(status, leased=leased), {})[0] is Outcome.DEFER
            assert decide(Kind.INJECT, _view(status, leased=leased), {})[0] is Outcome.DEFER


def test_a_pause_stops_an_unheld_turn_at_once_and_a_held_one_at_its_boundary() -> None:
    from brain.rules.controls import Kind, Outcome, decide

    for status in (TurnStatus.QUEUED, TurnStatus.RUNNING, TurnStatus.WAITING):
        assert decide(Kind.PAUSE, _view(status), {}) == (Outcome.APPLY, None)
    assert decide(Kind.PAUSE, _view(leased=True), {}) == (Outcome.DEFER, None)
    assert decide(Kind.PAUSE, _view(TurnStatus.PAUSED), {}) == (Outcome.APPLY, "it was paused already")


def test_a_resume_needs_the_revision_the_caller_saw_and_can_take_back_a_pause_not_applied_yet() -> None:
    from brain.rules.controls import Kind, Outcome, decide

    assert decide(Kind.RESUME, _view(TurnStatus.PAUSED), {"revision": 4}) == (Outcome.APPLY, None)
    outcome, why = decide(Kind.RESUME, _view(TurnStatus.PAUSED), {"revision": 3})
    assert outcome is Outcome.REJECT and "at revision 4, not 3" in (why or "")
    assert decide(Kind.RESUME, _view(leased=True, pause_pending=True), {"revision": 1})[0] is Outcome.APPLY
    assert decide(Kind.RESUME, _view(), {"revision": 4}) == (Outcome.REJECT, "the turn is not paused")


def test_a_cancel_ends_a_turn_with_nothing_running_at_once_else_once_its_executions_are_settled() -> None:
    from brain.rules.controls import Kind, Outcome, decide

    assert decide(Kind.CANCEL, _view(TurnStatus.QUEUED, accepted_executions=0), {})[0] is Outcome.APPLY
    assert decide(Kind.CANCEL, _view(leased=True), {})[0] is Outcome.APPLY  # mid model call: fenced out
    assert decide(Kind.CANCEL, _view(TurnStatus.WAITING, accepted_executions=2), {})[0] is Outcome.DEFER
    assert decide(Kind.CANCEL, _view(TurnStatus.PAUSED, accepted_executions=1), {})[0] is Outcome.DEFER
    # while it is being cancelled, nothing else is taken, and another cancel joins the first
    cancelling = _view(TurnStatus.WAITING, accepted_executions=1, cancelling=True)
    assert decide(Kind.CANCEL, cancelling, {})[0] is Outcome.DEFER
    assert decide(Kind.STEER, cancelling, {}) == (Outcome.REJECT, "the turn is being cancelled")


def test_a_new_thread_freezes_the_newest_version_of_the_latest_announcement() -> None:
    from datetime import timedelta

    from brain.store.bindings import newest

    now = datetime.now(UTC)

    def row(version: str, ago: float, name: str = "greet") -> dict[str, Any]:
        return {
            "name": name,
            "binding": {"name": name, "version": version},
            "announced_at": now - timedelta(seconds=ago),
        }

    # a pool that serves 1 and 2 side by side: 2, whatever order the rows come in
    assert newest([row("2", 0), row("1", 0)])["greet"]["version"] == "2"
    assert newest([row("10", 0), row("9", 0)])["greet"]["version"] == "10"
    # a version announced long before the latest announcement is not chosen (rolled back, say)
    assert newest([row("3", 3600), row("2", 0), row("1", 0)])["greet"]["version"] == "2"
    assert set(newest([row("1", 0), row("1", 0, name="other")])) == {"greet", "other"}
    # an MCP tool's versions are digests of its listing: the one announced later replaced the other
    assert newest([row("mcp-ffff", 5), row("mcp-0000", 1)])["greet"]["version"] == "mcp-0000"
    assert newest([row("mcp-0000", 5), row("mcp-ffff", 1)])["greet"]["version"] == "mcp-ffff"
    # so are an agent framework's (a tool edited, or moved to another framework, and its pool restarted)
    for old, new in (("pydantic-ai-ffff", "pydantic-ai-0000"), ("pydantic-ai-0000", "openai-agents-ffff")):
        assert newest([row(old, 5), row(new, 1)])["greet"]["version"] == new


class _Threads:
    """A store as ``FrozenThreads`` reads it: threads and agent definitions by key (its bindings
    part)."""

    def __init__(self, threads: list[str], agents: dict[str, Any], namespace: str = "n") -> None:
        self.rows = {
            t: {"id": t, "namespace": namespace, "agent_name": t, "agent_version": "1", "bindings": {}}
            for t in threads
        }
        self.agents = agents
        self.bindings = self

    async def thread(self, conn: Any, thread_id: str) -> Any:
        return self.rows.get(thread_id)

    async def threads(self, conn: Any, thread_ids: list[str]) -> list[Any]:
        return [self.rows[t] for t in thread_ids if t in self.rows]

    async def agent_definition(self, conn: Any, namespace: str, name: str, version: str) -> Any:
        return self.agents.get(f"{namespace}/{name}", self.agents.get(name))


def _definition(name: str) -> dict[str, Any]:
    return {"name": name, "version": "1", "model": {"kind": "scripted", "script": [{"content": "hi"}]}}


async def test_threads_read_for_many_turns_all_come_back_when_keeping_them_starts_the_cache_over() -> None:
    threads = FrozenThreads(_Threads(["a", "b", "c"], {t: _definition(t) for t in "abc"}), limit=2)
    await threads.get(None, "a")
    # Keeping "b" fills the cache, keeping "c" starts it over: "a" was kept, and must come back
    found = await threads.get_many(None, ["a", "b", "c"])
    assert sorted(found) == ["a", "b", "c"] and found["a"][0].name == "a"


async def test_two_namespaces_agents_of_one_name_and_version_are_kept_apart() -> None:
    # Given threads of two namespaces, each running its own agent "a" version 1
    store = _Threads(["a"], {"n/a": {**_definition("a"), "instructions": "of n"}})
    store.rows["m/a"] = {**store.rows["a"], "id": "m/a", "namespace": "m"}
    store.agents["m/a"] = {**_definition("a"), "instructions": "of m"}
    threads = FrozenThreads(store)
    # When both are read, one after the other (the first one's agent kept)
    first, second = await threads.get(None, "a"), await threads.get(None, "m/a")
    # Then each runs its namespace's definition
    assert (first[0].instructions, second[0].instructions) == ("of n", "of m")


async def test_a_thread_whose_stored_agent_does_not_validate_fails_alone() -> None:
    store = _Threads(["good", "bad", "gone"], {"good": _definition("good"), "bad": {"name": "bad"}})
    del store.rows["gone"]
    threads = FrozenThreads(store)
    # A read for many turns leaves it (and a thread that is not there) out, for the others' sake
    assert list(await threads.get_many(None, ["good", "bad", "gone"])) == ["good"]
    # Its own turn meets it as a clear error
    with pytest.raises(SchemaError, match=r"stored definition of agent bad version 1 is invalid at version"):
        await threads.get(None, "bad")


def test_each_binding_is_checked_by_its_own_schema_compiled_once() -> None:
    from brain.rules.calls import _CHECKERS

    strict = BINDINGS["send_email"] | {"digest": "a" * 64}
    loose = strict | {"digest": "b" * 64, "input_schema": {"type": "object"}}
    bad = call(args={"to": 5})
    assert "not of type 'string'" in (refusal(bad, {"send_email": strict}) or "")
    assert refusal(bad, {"send_email": loose}) is None  # not the other version's checker
    checker = _CHECKERS["a" * 64]
    assert "not of type 'string'" in (refusal(bad, {"send_email": strict}) or "")
    assert _CHECKERS["a" * 64] is checker  # compiled once, not for every call
