"""Controls on turns run by real Brain and Hands processes, driven from the CLI as a user would:
pause while a tool runs, resume with the revision seen (and a stale one), cancel a queued turn
and a turn whose tool runs in a Hands process, cancel racing completion, steer and inject (and
withdraw), approvals and manual tools, request ids replayed after a lost answer."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from infra.transport import Topology
from infra.transport.broker import Broker
from tests.support import Observer, Processes, TendonEnv, run_cli, wait_for

BRAIN = ["-m", "brain", "serve"]
HANDS_BULK = ["-m", "hands", "serve", "--route", "bulk", "--tools", "tests.brain_e2e_tools"]
EXIT_CONFLICT, EXIT_REJECTED = 4, 6

pytestmark = pytest.mark.chaos


class World:
    """A Brain and a bulk Hands pool of one test, an agent file per script, and the CLI."""

    def __init__(self, tendon: TendonEnv, processes: Processes, tmp_path: Path) -> None:
        tendon.routes.add("bulk")
        self.tendon = tendon
        self.processes = processes
        self.tmp = tmp_path
        self.runs_file = tmp_path / "runs.txt"
        self.env = {**tendon.env, "BULK_RUNS_FILE": str(self.runs_file)}
        self.obs = Observer(tendon)
        self._agents = 0

    async def start(self, *, brain: bool = True, hands: bool = True) -> None:
        if brain:
            await self.processes.start_ready("brain", BRAIN, self.env)
        if hands:
            await self.processes.start_ready("hands", HANDS_BULK, self.env)

    def agent(self, script: list[dict[str, Any]], **fields: Any) -> str:
        self._agents += 1
        tools = fields.pop("tools", ["slow_step"])
        definition = {"name": f"a{self._agents}", "version": "1", "tools": tools,
                      "model": {"kind": "scripted", "script": script}, **fields}  # fmt: skip
        path = self.tmp / f"agent{self._agents}.json"
        path.write_text(json.dumps(definition))
        return str(path)

    async def brain(self, *args: str) -> tuple[int, str, str]:
        return await run_cli(["-m", "brain", *args], self.env)

    async def submit(
        self,
        agent: str,
        text: str = "go",
        session: str = "s",
        request: str | None = None,
        *,
        expect: bool = False,
    ) -> str:
        """``expect``: its tools are expected later (no Brain has stored the pool's announcement yet)."""
        self._agents += 1
        code, out, err = await self.brain(
            "submit",
            "--session",
            session,
            "--request-id",
            request or f"r{self._agents}",
            "--agent",
            agent,
            *(["--expect-tools"] if expect else []),
            text,
        )
        assert code == 0, err
        return out.strip()

    async def control(self, *args: str) -> tuple[int, dict[str, Any]]:
        code, out, err = await self.brain(*args, "--json")
        assert code in (0, EXIT_REJECTED), err
        return code, json.loads(out)

    async def show(self, turn_id: str) -> dict[str, Any]:
        code, out, err = await self.brain("show", turn_id, "--json")
        assert code == 0, err
        return json.loads(out)

    async def execution_status(self, turn_id: str, status: str) -> Any:
        async def reached() -> Any:
            rows = await self.obs.executions(turn_id)
            return rows[0] if rows and rows[0]["status"] == status else None

        return await wait_for(reached, timeout=30, what=f"the execution of {turn_id} to be {status}")

    def runs(self) -> list[str]:
        return self.runs_file.read_text().splitlines() if self.runs_file.exists() else []


@pytest.fixture
def world(tendon: TendonEnv, processes: Processes, tmp_path: Path) -> World:
    return World(tendon, processes, tmp_path)


SLOW = [{"tool_calls": [{"tool": "slow_step", "args": {"seconds": 3}}]}, {"content": "done"}]


def held(gate: Path) -> list[dict[str, Any]]:
    """SLOW, but its step runs until ``gate`` exists: for a test that acts while it runs through
    CLI calls, each a process that may take seconds to start on a busy machine."""
    return [
        {"tool_calls": [{"tool": "slow_step", "args": {"seconds": 0, "gate": str(gate)}}]},
        {"content": "done"},
    ]


async def test_a_turn_paused_while_its_tool_runs_takes_the_result_but_goes_on_only_once_resumed(
    world: World,
) -> None:
    await world.start()
    gate = world.tmp / "step"
    turn = await world.submit(world.agent(held(gate)))
    await world.execution_status(turn, "running")

    # When it is paused while its tool runs
    code, receipt = await world.control("pause", turn)
    assert (code, receipt["status"]) == (0, "applied")
    assert (await world.show(turn))["status"] == "paused"

    # Then the tool's result is applied, but the turn does not call the model again
    gate.touch()
    await world.execution_status(turn, "succeeded")
    shown = await world.show(turn)
    assert shown["status"] == "paused" and len(await world.obs.facts(turn, "turn.model_replied")) == 1

    # A resume with a revision the caller did not see is rejected; with the current one it goes on
    code, stale = await world.control("resume", turn, "--revision", str(shown["revision"] - 1))
    assert code == EXIT_REJECTED and "look at it again" in stale["reason"]
    code, receipt = await world.control("resume", turn, "--revision", str(shown["revision"]))
    assert (code, receipt["status"]) == (0, "applied")
    done = await world.obs.wait_turn(turn, "completed")
    assert done["result"] == {"text": "done"}


async def test_cancelling_a_turn_whose_tool_runs_in_a_hands_process_stops_the_tool_and_ends_it_cancelled(
    world: World,
) -> None:
    await world.start()
    turn = await world.submit(world.agent([{"tool_calls": [{"tool": "slow_step", "args": {"seconds": 60}}]}]))
    running = await world.execution_status(turn, "running")

    code, receipt = await world.control("cancel", turn)
    assert (code, receipt["status"]) == (0, "received")  # it ends once the tool is settled

    await world.obs.wait_turn(turn, "cancelled", timeout=30)
    (execution,) = await world.obs.executions(turn)
    assert execution["status"] == "cancelled"
    assert world.runs() == [f"step started {running['id']}", f"step stopped by a cancel {running['id']}"]
    code, out, _ = await world.brain("controls", turn, "--json")
    assert [(c["kind"], c["status"]) for c in json.loads(out)] == [("cancel", "applied")]
    assert [f["kind"] for f in await world.obs.facts(turn)][-2:] == ["control.applied", "turn.cancelled"]


async def test_a_queued_turn_is_cancelled_at_once_and_never_runs(world: World) -> None:
    await world.start(brain=False)  # nobody runs turns yet (nor stores the pool's announcement)
    turn = await world.submit(world.agent(SLOW), expect=True)

    code, receipt = await world.control("cancel", turn)
    assert (code, receipt["status"]) == (0, "applied")
    assert (await world.show(turn))["status"] == "cancelled"

    # A Brain that starts later leaves it alone; a control on it now says why not
    await world.start(hands=False)
    code, late = await world.control("pause", turn)
    assert code == EXIT_REJECTED and late["reason"] == "the turn is cancelled already"
    assert (await world.show(turn))["runs"] == 0 and world.runs() == []


async def test_a_cancel_racing_the_turns_completion_either_cancels_it_or_is_rejected_never_both(
    world: World,
) -> None:
    await world.start(hands=False)
    agent = world.agent([{"content": "quick"}], tools=[])
    turns = [await world.submit(agent, request=f"race-{i}") for i in range(4)]
    for turn in turns:
        code, receipt = await world.control("cancel", turn)
        assert receipt["status"] in ("applied", "received", "rejected")
    for turn in turns:

        async def ended(turn: str = turn) -> Any:
            d = await world.show(turn)
            return d if d["status"] in ("completed", "cancelled") else None

        final = await wait_for(ended, timeout=30, what=f"turn {turn} to end")
        code, out, _ = await world.brain("controls", turn, "--json")
        (decided,) = json.loads(out)
        if final["status"] == "cancelled":
            assert decided["status"] == "applied", decided
        else:
            assert decided["status"] == "rejected" and "completed" in decided["reason"], decided


async def test_a_steer_during_a_model_call_applies_at_the_next_boundary_and_a_withdrawn_inject_never(
    world: World,
) -> None:
    await world.start()
    gate = world.tmp / "reply"  # the first reply waits for the three controls below
    script = [
        {"gate": str(gate), "tool_calls": [{"tool": "slow_step", "args": {"seconds": 0.5}}]},
        {"content": "ok"},
    ]
    turn = await world.submit(world.agent(script))

    async def in_model_call() -> Any:
        row = await world.obs.turn(turn)
        return row if row["lease_owner"] and row["model_calls"] == 0 else None

    await wait_for(in_model_call, timeout=20, what="the first model call")
    code, steer = await world.control("steer", turn, "keep it short")
    assert (code, steer["status"]) == (0, "received")
    code, inject = await world.control("inject", turn, "also cc the boss")
    code, withdrawn = await world.control("withdraw", turn, str(inject["control_id"]))
    assert withdrawn["status"] == "applied", withdrawn
    gate.touch()

    await world.obs.wait_turn(turn, "completed")
    kinds = [f["kind"] for f in await world.obs.facts(turn)]
    # the reply in flight was committed whole, its tool ran, then the steer joined before the next call
    assert kinds.index("turn.input_added") > kinds.index("turn.results_applied")
    assert kinds.index("turn.input_added") < len(kinds) - 1 - kinds[::-1].index("turn.model_replied")
    (added,) = await world.obs.facts(turn, "turn.input_added")
    assert (added["control"], added["text"]) == ("steer", "keep it short")
    history = (await world.show(turn))["history"]
    assert {"role": "steer", "text": "keep it short"} in history
    assert not any("cc the boss" in json.dumps(m) for m in history)
    code, out, _ = await world.brain("controls", turn, "--json")
    assert [(c["kind"], c["status"]) for c in json.loads(out)] == [
        ("steer", "applied"), ("inject", "withdrawn"), ("withdraw", "applied"),
    ]  # fmt: skip


async def test_a_control_whose_turn_ends_before_its_boundary_is_rejected_saying_so(world: World) -> None:
    await world.start(hands=False)
    gate = world.tmp / "reply"  # the model answers once the steer is in: however slow the CLI is
    turn = await world.submit(world.agent([{"gate": str(gate), "content": "the only reply"}], tools=[]))

    async def in_model_call() -> Any:
        row = await world.obs.turn(turn)
        return row if row["lease_owner"] else None

    await wait_for(in_model_call, timeout=20, what="the model call")
    code, steer = await world.control("steer", turn, "too late")
    assert steer["status"] == "received"
    gate.touch()
    await world.obs.wait_turn(turn, "completed")

    async def decided() -> Any:
        code, out, _ = await world.brain("controls", turn, "--json")
        (c,) = json.loads(out)
        return c if c["status"] != "received" else None

    c = await wait_for(decided, timeout=20, what="the steer to be decided")
    assert (c["status"], c["reason"]) == ("rejected", "the turn completed first")


async def test_the_same_request_id_gives_the_original_receipt_and_another_control_under_it_a_conflict(
    world: World,
) -> None:
    await world.start()
    gate = world.tmp / "step"
    turn = await world.submit(world.agent(held(gate)))
    await world.execution_status(turn, "running")
    code, first = await world.control("pause", turn, "--request-id", "p1")
    # the answer was lost: the caller asks again with the same request id
    code, again = await world.control("pause", turn, "--request-id", "p1")
    assert again == first and code == 0
    code, out, err = await world.brain("cancel", turn, "--request-id", "p1")
    assert code == EXIT_CONFLICT and err.startswith("brain: CONFLICT:") and "'p1'" in err
    assert (await world.show(turn))["status"] == "paused"
    gate.touch()  # the step ends here, not in the teardown's drain


async def test_a_call_that_needs_approval_waits_runs_once_approved_and_a_second_answer_is_rejected(
    world: World,
) -> None:
    await world.start()
    calls = [
        {"tool": "wire_money", "args": {"amount": 5, "to": "ann"}},
        {"tool": "wire_money", "args": {"amount": 7, "to": "cy"}},
    ]
    turn = await world.submit(
        world.agent([{"tool_calls": calls}, {"content": "wired"}], tools=["wire_money"])
    )

    async def both_pending() -> Any:
        rows = await world.obs.executions(turn)
        return rows if len(rows) == 2 and all(r["status"] == "pending" for r in rows) else None

    first, second = await wait_for(both_pending, timeout=30, what="two calls waiting for approval")
    shown = await world.show(turn)
    assert shown["status"] == "waiting" and shown["waiting_for"] == (
        f"approval of wire_money {first['call_id']}; approval of wire_money {second['call_id']}"
    )
    assert world.runs() == []

    code, receipt = await world.control("respond", turn, first["call_id"], "--approve")
    assert (code, receipt["status"]) == (0, "applied")
    await world.execution_status(turn, "succeeded")
    assert world.runs() == [f"wired 5 to ann {first['id']}"]
    # An answer to a call that was answered already is rejected, saying how it was resolved
    code, again = await world.control("respond", turn, first["call_id"], "--deny", "changed my mind")
    assert code == EXIT_REJECTED and "waits for no answer: it is succeeded (ran)" in again["reason"]
    assert (await world.show(turn))["status"] == "waiting"  # the second call still waits

    code, receipt = await world.control("respond", turn, second["call_id"], "--approve")
    await world.obs.wait_turn(turn, "completed")
    assert sorted(world.runs()) == sorted([f"wired 5 to ann {first['id']}", f"wired 7 to cy {second['id']}"])


async def test_a_denied_call_and_a_manual_tools_result_go_back_to_the_model(world: World) -> None:
    await world.start()
    script = [
        {"tool_calls": [{"tool": "wire_money", "args": {"amount": 9, "to": "bob"}}]},
        {"tool_calls": [{"tool": "ask_person", "args": {"question": "which account?"}}]},
        {"content": "{results}"},
    ]
    manual = [
        {
            "name": "ask_person",
            "input_schema": {"type": "object", "properties": {"question": {"type": "string"}}},
        }
    ]
    turn = await world.submit(world.agent(script, tools=["wire_money"], manual_tools=manual))
    first = await world.execution_status(turn, "pending")
    code, denied = await world.control("respond", turn, first["call_id"], "--deny", "not today")
    assert denied["status"] == "applied"

    async def second_pending() -> Any:
        rows = [r for r in await world.obs.executions(turn) if r["status"] == "pending"]
        return rows[0] if rows else None

    ask = await wait_for(second_pending, timeout=30, what="the manual tool's call")
    code, wrong = await world.control("respond", turn, ask["call_id"], "--approve")
    assert code == EXIT_REJECTED and "needs a result" in wrong["reason"]
    code, answered = await world.control(
        "respond", turn, ask["call_id"], "--result", '{"account": "savings"}'
    )
    assert answered["status"] == "applied"

    done = await world.obs.wait_turn(turn, "completed")
    text = done["result"]["text"]
    assert f"{first['call_id']}: null" in text and '{"account": "savings"}' in text
    rows = {r["call_id"]: r for r in await world.obs.executions(turn)}
    assert (rows[first["call_id"]]["status"], rows[first["call_id"]]["how"]) == ("failed", "denied")
    assert rows[first["call_id"]]["error"] == {"code": "denied", "message": "not today"}
    assert (rows[ask["call_id"]]["status"], rows[ask["call_id"]]["how"]) == ("succeeded", "manual")
    assert world.runs() == []  # the denied call never reached the Hands


async def test_a_cancel_that_reaches_the_hands_before_its_command_leaves_a_tombstone_and_it_never_runs(
    world: World,
) -> None:
    # Given a Hands pool, and a Brain that dies right after committing the intent, before
    # publishing its command
    await world.start(brain=False)
    doomed = world.processes.start(
        "brain", BRAIN, {**world.env, "TENDON_KILL_AT": "brain.after_intent_commit@call-1"}
    )
    turn = await world.submit(world.agent(SLOW), expect=True)  # the Brain may not have read the announcement
    assert await world.processes.wait_exit(doomed, timeout=30) == -9
    await world.execution_status(turn, "intended")

    # When the turn is cancelled: no Hands worker accepted its call, so the cancel ends it at
    # once (its cancel for the Hands waits in the outbox), and a new Brain comes up: it publishes
    # the cancel, and never sends the command of a cancelled call
    code, receipt = await world.control("cancel", turn)
    assert receipt["status"] == "applied"
    assert (await world.show(turn))["status"] == "cancelled"
    (execution,) = await world.obs.executions(turn)
    assert execution["status"] == "cancelled"
    await world.start(hands=False)

    # Then the Hands keep a tombstone, and the tool never runs
    async def tombstone() -> Any:
        return await world.obs.ledger()

    (ledger,) = await wait_for(tombstone, timeout=30, what="the tombstone in the ledger")
    assert (ledger["execution_id"], ledger["status"]) == (execution["id"], "cancelled")
    assert world.runs() == []


@pytest.mark.timeout(300)  # three processes and a dozen CLI calls, on a busy machine
async def test_turns_cancelled_while_their_routes_pool_is_down_end_at_once_and_a_pool_that_starts_runs_none(
    world: World,
) -> None:
    # Given a Brain, and a pool of the route that announced its tools and stopped: nobody serves
    # it, and the repair scan would nudge a quiet execution within half a second
    world.env["TENDON_STALL_SECONDS"] = "0.5"
    await world.start(hands=False)
    pool = await world.processes.start_ready("hands", HANDS_BULK, world.env)
    pool.send_signal(signal.SIGTERM)
    assert await world.processes.wait_exit(pool) == 0
    # and four turns (of four sessions: a thread runs its turns one after another) whose tool
    # calls were sent to the route's command queue
    agent = world.agent(SLOW)
    turns = [await world.submit(agent, session=f"down-{i}") for i in range(4)]
    for turn in turns:
        await world.execution_status(turn, "intended")

    # When each is cancelled
    for turn in turns:
        code, receipt = await world.control("cancel", turn)
        # Then the cancel is applied at once: no worker accepted the call, so nothing waits
        assert (code, receipt["status"]) == (0, "applied")
        code, out, _ = await world.brain("wait", turn, "--timeout", "5", "--json")
        assert json.loads(out)["status"] == "cancelled", out

    # And while nobody serves the route, its control queue gets the four cancels and nothing more
    topology = Topology(world.tendon.prefix)
    async with Broker(world.tendon.amqp_url, topology) as broker:

        async def cancels_sent() -> bool:
            return await broker.waiting(topology.controls("bulk")) >= 4

        await wait_for(cancels_sent, timeout=30, what="the cancels on the control queue")
        await asyncio.sleep(2.0)  # several scan passes, each of which would have asked for replays
        assert await broker.waiting(topology.controls("bulk")) == 4

    # When a pool of the route starts, with the commands and their cancels waiting
    pool = await world.processes.start_ready("hands", HANDS_BULK, world.env)

    # Then it runs none of them, whichever queue it reads first: a cancel read first leaves a
    # tombstone (its command is a duplicate), a command read first waits for its cancel
    async def all_taken() -> Any:
        output = world.processes.output(pool)
        taken = output.count("command_duplicate") + output.count("execution_cancelled")
        return await world.obs.ledger() if taken >= 4 else None

    ledger = await wait_for(all_taken, timeout=60, what="every command taken and cancelled")
    assert sorted(r["status"] for r in ledger) == ["cancelled"] * 4
    assert world.runs() == []
    # and nothing is parked, on either side
    assert await world.obs.fetch("SELECT id FROM {hands}.parked") == []
    assert await world.obs.fetch("SELECT id FROM {brain}.parked") == []
