"""Metrics and traces of real Brain and Hands processes: the Prometheus metrics change as a turn
runs, and the spans both processes export by OTLP make one trace per turn, in which the Hands'
execution span is a child of the Brain's model call that asked for the tool."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from brain.api import hash_token
from tests.otlp_server import OtlpReceiver, ReceivedSpan
from tests.support import Processes, TendonEnv, free_port, wait_for
from tests.test_api import agent

pytestmark = pytest.mark.chaos
OPERATOR = "operator-token"
TENANT = "tenant-token"


def sample(text: str, name: str, **labels: str) -> float:
    """One sample's value of a Prometheus exposition (0 when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        found = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
        if found is None or found.group(1) != name:
            continue
        have = ",".join(sorted(p for p in (found.group(2) or "").split(",") if p))
        if have == wanted:
            return float(found.group(3))
    return 0.0


async def test_metrics_follow_a_turn_and_its_hands_span_has_the_brains_parent(
    tendon: TendonEnv, processes: Processes
) -> None:
    tendon.routes.add("bulk")
    port = free_port()
    with OtlpReceiver() as otlp:
        env = {
            **tendon.env,
            "TENDON_HTTP": f"127.0.0.1:{port}",
            "TENDON_API_TOKENS": f"acme:{hash_token(TENANT)}",
            "TENDON_OPERATOR_TOKENS": hash_token(OPERATOR),
            "TENDON_OTLP_ENDPOINT": otlp.url,
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # export within a tenth of a second
        }
        await processes.start_ready("brain", ["-m", "brain", "serve"], env)
        tools = ["-m", "hands", "serve", "--route", "bulk", "--tools", "tests.brain_e2e_tools"]
        await processes.start_ready("hands", tools, env)
        url = f"http://127.0.0.1:{port}"
        operator = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {OPERATOR}"})
        tenant = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TENANT}"})
        async with operator, tenant:

            async def metrics() -> str:
                answer = await operator.get("/metrics")
                assert answer.status_code == 200, answer.text
                return answer.text

            assert (await tenant.get("/metrics")).status_code == 403  # an operator's view
            before = await metrics()
            slow = agent([{"tool_calls": [{"tool": "slow_step", "args": {"seconds": 3}}]}, {"content": "ok"}])
            body = {"request_id": "r1", "input": "go", "agent": slow}
            turn = (await tenant.post("/v1/sessions/s-metrics/turns", json=body)).json()["turn_id"]

            async def tool_running() -> str | None:
                text = await metrics()
                return text if sample(text, "tendon_executions", status="running") >= 1 else None

            during = await wait_for(tool_running, timeout=30, what="the metrics to show the tool running")
            assert sample(during, "tendon_turns", status="waiting") >= 1
            done = (await tenant.get(f"/v1/turns/{turn}", params={"wait": "30"})).json()
            assert done["status"] == "completed"
            after = await metrics()
        grew = {
            ("tendon_turns", "completed"): 1,
            ("tendon_executions", "succeeded"): 1,
        }
        for (name, status), by in grew.items():
            assert sample(after, name, status=status) == sample(before, name, status=status) + by, name
        assert sample(after, "tendon_turn_seconds_count", status="completed") >= 1
        assert sample(after, "tendon_turn_seconds_sum", status="completed") >= 3
        assert sample(after, "tendon_tool_seconds_count", tool="slow_step", status="succeeded") >= 1
        assert sample(after, "tendon_model_call_seconds_count", outcome="replied") >= 2
        assert sample(after, "tendon_update_apply_seconds_count") >= 1
        assert sample(after, "tendon_executions_unknown") == 0

        def spans() -> dict[str, list[ReceivedSpan]]:
            by_name: dict[str, list[ReceivedSpan]] = {}
            for span in otlp.received():
                if span.attributes.get("tendon.turn_id") == turn:
                    by_name.setdefault(span.name, []).append(span)
            return by_name

        async def whole_trace() -> dict[str, list[ReceivedSpan]] | None:
            found = spans()
            return found if {"turn", "model call", "execute slow_step"} <= set(found) else None

        found: dict[str, Any] = await wait_for(whole_trace, timeout=30, what="the turn's spans")
    (turn_span,) = found["turn"]
    (execution,) = found["execute slow_step"]
    calls = found["model call"]
    assert turn_span.service == "tendon-brain" and execution.service == "tendon-hands"
    assert {s.trace_id for s in [turn_span, execution, *calls]} == {turn_span.trace_id}
    assert all(c.parent_span_id == turn_span.span_id for c in calls)
    # The Hands' span is a child of the model call that asked for the tool, across processes.
    assert execution.parent_span_id in {c.span_id for c in calls}
    assert execution.parent_span_id == calls[0].span_id
