"""A long tool's output, live and after a crash, through real processes (PostgreSQL, RabbitMQ, S3):
its pages reach a stream subscriber while it runs, a page over the offload threshold travels by S3
reference, and after its Hands is SIGKILLed the safe tool runs again on another worker: the output
reads back whole, every byte committed before the kill kept, the re-run's pages apart by attempt,
and no range lost (a lost one would be an explicit ``execution.output_gap``).

The tool writes for about 3 seconds an attempt; ``TENDON_TEST_LONG=1`` makes it the issue's 30."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

import httpx

from tests.s3server import S3Server
from tests.support import Observer, Processes, TendonEnv, free_port, wait_for

BRAIN = ["-m", "brain", "serve"]
HANDS_LAB = ["-m", "hands", "serve", "--route", "lab", "--tools", "tests.hands_test_tools"]
LONG = bool(os.environ.get("TENDON_TEST_LONG"))
LINES, EVERY = (60, 0.5) if LONG else (12, 0.25)
BIG, THRESHOLD = 20_000, 4096  # the big page's bytes, well over the offload threshold


def agent() -> dict[str, Any]:
    call = {"tool": "progress", "args": {"lines": LINES, "every": EVERY, "big_at": 3, "big_size": BIG}}
    script = [{"tool_calls": [call]}, {"content": "done"}]
    return {
        "name": "progress",
        "version": "1",
        "tools": ["progress"],
        "model": {"kind": "scripted", "script": script},
    }


async def follow(url: str, session: str, seen: list[dict[str, Any]]) -> None:
    """Keep every fact of the session's stream in ``seen`` (with the entry's seq), until cancelled."""
    params = {"pending": "true"}
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120, connect=10)) as http:
        async with http.stream("GET", f"/v1/sessions/{session}/stream", params=params) as response:
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    entry = json.loads(line[5:])
                    seen += [f | {"seq": entry["seq"]} for f in entry.get("facts", ())]


def outputs(seen: list[dict[str, Any]], attempt: int) -> str:
    return "".join(f["text"] for f in seen if f["kind"] == "execution.output" and f["attempt"] == attempt)


async def test_a_long_tools_output_is_live_travels_big_by_reference_and_reads_back_whole_after_a_kill(
    tendon: TendonEnv, processes: Processes, s3_server: S3Server
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**tendon.env, "TENDON_OFFLOAD_THRESHOLD": str(THRESHOLD), "TENDON_HTTP": f"127.0.0.1:{port}"}
    session = f"s-out-{tendon.suffix}"
    obs = Observer(tendon)
    hands = await processes.start_ready("hands", HANDS_LAB, env)
    await processes.start_ready("brain", BRAIN, env)
    seen: list[dict[str, Any]] = []
    stream = asyncio.create_task(follow(url, session, seen))
    try:
        await asyncio.sleep(0.5)
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            body = {"request_id": "r1", "input": "write a lot", "agent": agent()}
            turn_id = (await http.post(f"/v1/sessions/{session}/turns", json=body)).json()["turn_id"]

            # Given the tool's pages reaching the subscriber while it runs (the big one among them)
            async def live() -> bool | None:
                return "attempt 1 line 5\n" in outputs(seen, 1) or None

            await wait_for(live, timeout=60, what="the first attempt's output on the stream")
            assert not [f for f in seen if f["kind"] in ("execution.succeeded", "execution.failed")]
            # When its Hands is killed mid-run, and another takes over
            hands.send_signal(signal.SIGKILL)
            await processes.start_ready("hands2", HANDS_LAB, env)
            done = (await http.get(f"/v1/turns/{turn_id}", params={"wait": "60"})).json()
            if done["status"] != "completed":
                done = (await http.get(f"/v1/turns/{turn_id}", params={"wait": "60"})).json()
            assert done["status"] == "completed", done
            (execution,) = done["executions"]
            pages = (
                await http.get(f"/v1/executions/{execution['id']}/output", params={"limit": 1000})
            ).json()
            await asyncio.sleep(0.5)  # the stream reads the last entries
    finally:
        stream.cancel()
        await asyncio.gather(stream, return_exceptions=True)

    # Then it reads back whole: the pages follow each other with no range missing...
    ends = [p["offset"] + len(p["data"].encode()) for p in pages["pages"]]
    assert [p["offset"] for p in pages["pages"]] == [0, *ends[:-1]]
    assert ends[-1] == pages["output_bytes"] == execution["output_bytes"]
    text = "".join(p["data"] for p in pages["pages"])
    first, _, second = text.partition("attempt 2 line 1\n")
    # ...what the first attempt wrote before the kill kept, the big page whole, the re-run after it
    lines = first.splitlines()
    assert lines[:2] == ["attempt 1 line 1", "attempt 1 line 2"] and lines[2] == "#" * (BIG - 1)
    assert lines[3:] == [f"attempt 1 line {i}" for i in range(3, len(lines))] and len(lines) >= 6
    again = ["attempt 2 line 2", "#" * (BIG - 1), *(f"attempt 2 line {i}" for i in range(3, LINES + 1))]
    assert second.splitlines() == again
    # the ledger holds the same bytes
    chunks = await obs.fetch(
        "SELECT data FROM {hands}.output_chunks WHERE execution_id = $1 ORDER BY byte_offset", execution["id"]
    )
    assert "".join(c["data"] for c in chunks) == text
    # The stream said both attempts apart, the re-run between them, and no gap
    kinds = [(f["kind"], f.get("attempt")) for f in seen if f.get("execution_id") == execution["id"]]
    rerun = kinds.index(("execution.running", 2))
    assert {a for k, a in kinds[:rerun] if k == "execution.output"} == {1}
    assert {a for k, a in kinds[rerun:] if k == "execution.output"} == {2}
    assert not [k for k, _ in kinds if k == "execution.output_gap"]
    assert outputs(seen, 1).startswith("attempt 1 line 1\nattempt 1 line 2\n#")
    # And the big page went through S3, bound to its own event
    listed = s3_server.client().list_objects_v2(
        Bucket=s3_server.bucket, Prefix=f"default/{session}/{execution['id']}/output_page-"
    )
    assert [o["Size"] for o in listed.get("Contents", [])] and all(
        o["Size"] > BIG for o in listed["Contents"]
    )
