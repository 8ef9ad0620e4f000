"""A result object is the body of one message only (invariant 9), end to end.

Two executions of one session share the session's scope in S3. A ``succeeded`` event of one of
them whose ``body_ref`` points at the other's (real, intact, correctly hashed) result object
must not pass for its result: the Brain refuses it and parks it with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aio_pika

from protocol import ObjectRef, SucceededEvent, encode
from tests.support import Observer, Processes, TendonEnv, run_cli, wait_for

BRAIN = ["-m", "brain", "serve"]
HANDS_LAB = ["-m", "hands", "serve", "--route", "lab", "--tools", "tests.hands_test_tools"]
BIG = 20_000  # bytes of result: well over the offload threshold below
THRESHOLD = "4096"


def _two_call_agent(tmp_path: Path) -> str:
    """One model step asking for two tools at once: a big result, and one that keeps running."""
    agent = {
        "name": "two-calls",
        "version": "1",
        "tools": ["big", "wait_cancel"],
        "model": {
            "kind": "scripted",
            "script": [
                {
                    "tool_calls": [
                        {"tool": "big", "args": {"size": BIG}},
                        {"tool": "wait_cancel", "args": {"seconds": 60}},
                    ]
                },
                {"content": "done"},
            ],
        },
    }
    path = tmp_path / "two_call_agent.json"
    path.write_text(json.dumps(agent))
    return str(path)


async def _publish(amqp_url: str, queue: str, body: bytes) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.default_exchange.publish(
            aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=queue
        )


async def test_a_succeeded_event_whose_body_ref_is_a_sibling_executions_result_is_refused(
    tendon: TendonEnv, processes: Processes, s3_server: Any, tmp_path: Path
) -> None:
    env = {**tendon.env, "TENDON_OFFLOAD_THRESHOLD": THRESHOLD}
    session = f"s-{tendon.suffix}"
    obs = Observer(tendon)
    await processes.start_ready("hands", HANDS_LAB, env)
    await processes.start_ready("brain", BRAIN, env)

    # Given a turn with two executions in one session: A returned a big result (offloaded to
    # S3 and applied), B is still running (accepted, started, one output page)
    code, out, err = await run_cli(
        ["-m", "brain", "submit", "--session", session, "--request-id", "r"]
        + ["--agent", _two_call_agent(tmp_path), "two calls"],
        env,
    )
    assert code == 0, err
    turn_id = out.strip()

    async def a_done_and_b_waiting() -> dict[str, Any] | None:
        rows = {r["tool"]: r for r in await obs.executions(turn_id)}
        a, b = rows.get("big"), rows.get("wait_cancel")
        if a is None or b is None or a["status"] != "succeeded" or b["last_seq"] < 3:
            return None
        # B's last event in Hands' ledger has reached the Brain: nothing else is on its way.
        (ledger,) = await obs.fetch(
            "SELECT last_seq FROM {hands}.executions WHERE execution_id = $1", b["id"]
        )
        return rows if ledger["last_seq"] == b["last_seq"] else None

    rows = await wait_for(a_done_and_b_waiting, timeout=60, what="A succeeded and B running")
    a, b = rows["big"], rows["wait_cancel"]
    assert a["result"] == {"blob": "x" * BIG} and b["status"] == "running"
    (a_event,) = [e for e in await obs.hands_events(a["id"]) if e["kind"] == "succeeded"]
    a_ref = ObjectRef.model_validate(a_event["body_ref"])
    assert a_ref is not None and a_ref.scope == f"default/{session}"  # A's result went through S3

    # When B's next event arrives as a succeeded whose body_ref is A's result object (right
    # execution id, namespace, session, request digest and seq: only the object is A's)
    forged = SucceededEvent(
        execution_id=b["id"],
        namespace="default",
        session_id=session,
        request_digest=b["request_digest"],
        seq=b["last_seq"] + 1,
        body_ref=a_ref,
    )
    await _publish(tendon.amqp_url, f"{tendon.prefix}.updates", encode(forged))

    # Then it is parked (never applied: B does not succeed)...
    async def refused() -> str | None:
        (b_now,) = [r for r in await obs.executions(turn_id) if r["id"] == b["id"]]
        if b_now["status"] == "succeeded":
            raise AssertionError(f"B was recorded as succeeded with result {str(b_now['result'])[:80]}")
        rows = await obs.fetch(
            "SELECT reason FROM {brain}.parked WHERE execution_id = $1 AND kind = 'succeeded'", b["id"]
        )
        return rows[0]["reason"] if rows else None

    reason = await wait_for(refused, timeout=30, what="the forged event parked")
    # ...with a reason naming the binding the object has and the one B's event expects...
    expected = f"{b['id']}/succeeded/{forged.seq}"
    assert f"bound_to '{a['id']}/succeeded/{a_event['seq']}' does not match expected '{expected}'" in reason
    # ...and B did not take A's result
    (b_now,) = [r for r in await obs.executions(turn_id) if r["id"] == b["id"]]
    assert b_now["status"] != "succeeded"
    assert b_now["result"] != a["result"]
