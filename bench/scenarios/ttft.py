"""Time to first token: from the model server sending a reply's first token to a subscriber of the
session's stream (``previews=true``) receiving it through a Brain, against the same token read
straight from the model server by the ``openai`` client; and the journal writes a streamed reply
costs per 1,000 tokens.

The model server (``bench.model_server``) streams 1,000 one-word tokens per reply and notes when
its first token left; both readers note when it reached them, by the same wall clock. A Brain
(distributed mode, HTTP API) runs one turn at a time in one session, with the subscriber's stream
open from before the submit. Previews are never stored, so the journal entries of a turn are what
its streamed reply cost in writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import httpx
import openai

from bench.harness import BRAIN, TendonWorld, free_port, median, pct
from bench.model_server import StreamingModel
from bench.scenarios.base import Context, Result, Row

TOKENS = 1000
WARM_UP = 3  # first rounds left out: connections and caches


async def _direct(client: openai.AsyncOpenAI, model: StreamingModel, key: str) -> float:
    """Seconds from the server sending the first token of the answer to ``key`` to its arrival."""
    stream = await client.chat.completions.create(
        model="bench-model", messages=[{"role": "user", "content": key}], stream=True
    )
    arrived = 0.0
    async for chunk in stream:
        if not arrived and chunk.choices and chunk.choices[0].delta.content:
            arrived = time.time()
    return arrived - model.first_sent[key]


class Subscriber:
    """Reads a session's stream with previews; notes when each turn's first text arrived and
    when its completion did."""

    def __init__(self, url: str, session: str, cursor: int) -> None:
        self.first_text: dict[str, float] = {}
        self.done: dict[str, asyncio.Event] = {}
        self._task = asyncio.create_task(self._read(url, session, cursor))

    def completed(self, turn_id: str) -> asyncio.Event:
        return self.done.setdefault(turn_id, asyncio.Event())

    async def _read(self, url: str, session: str, cursor: int) -> None:
        params = {"cursor": str(cursor), "previews": "true"}
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120, connect=10)) as http:
            async with http.stream("GET", f"/v1/sessions/{session}/stream", params=params) as response:
                kind = ""
                async for line in response.aiter_lines():
                    if line.startswith("event:"):
                        kind = line[6:].strip()
                    elif line.startswith("data:") and kind == "preview":
                        data = json.loads(line[5:])
                        if data.get("kind") == "text" and data.get("text"):
                            self.first_text.setdefault(data["turn_id"], time.time())
                    elif line.startswith("data:") and kind == "entry":
                        data = json.loads(line[5:])
                        if any(f["kind"] == "turn.completed" for f in data.get("facts", ())):
                            self.completed(data["turn_id"]).set()

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def _through_tendon(ctx: Context, model: StreamingModel, n: int) -> tuple[list[float], list[int]]:
    """(seconds from the first token's send to its arrival, journal entries) per turn."""
    world = TendonWorld(ctx.services, ctx.procs)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spec = {"kind": "openai", "name": "bench-model", "base_url": model.url, "timeout": 60}
    agent = {"name": "ttft", "version": "1", "tools": [], "model": spec}
    gaps: list[float] = []
    entries: list[int] = []
    try:
        await world.start_process("brain", BRAIN, {"TENDON_HTTP": f"127.0.0.1:{port}"})
        await world.open()
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:

            async def turn(i: int) -> str:
                body = {"request_id": f"r{i}", "input": f"tendon-{i}", "agent": agent}
                answer = await http.post("/v1/sessions/ttft/turns", json=body)
                answer.raise_for_status()
                return str(answer.json()["turn_id"])

            first = await turn(-1)  # the session exists from its first turn on
            await http.get(f"/v1/turns/{first}", params={"wait": "60"})
            cursor = (await http.get("/v1/sessions/ttft/snapshot")).json()["cursor"]
            subscriber = Subscriber(url, "ttft", cursor)
            await asyncio.sleep(0.5)  # the stream is open
            try:
                for i in range(n):
                    # A pause between turns: the previews of the last reply still queued for a
                    # slow reader would fill its queue, and a full queue drops the next pieces.
                    await asyncio.sleep(0.3)
                    turn_id = await turn(i)
                    await asyncio.wait_for(subscriber.completed(turn_id).wait(), 60)
                    gaps.append(subscriber.first_text[turn_id] - model.first_sent[f"tendon-{i}"])
                    rows = await world.fetch(
                        f"SELECT count(*) AS c FROM {world.brain_schema}.journal WHERE turn_id = $1", turn_id
                    )
                    entries.append(int(rows[0]["c"]))
            finally:
                await subscriber.close()
    finally:
        await world.cleanup()
    return gaps, entries


async def run(ctx: Context) -> Result:
    n = ctx.n(20, 200) + WARM_UP
    with StreamingModel(TOKENS) as model:
        client = openai.AsyncOpenAI(base_url=model.url, api_key="bench")
        direct = [await _direct(client, model, f"direct-{i}") for i in range(n)][WARM_UP:]
        await client.close()
        tendon, entries = await _through_tendon(ctx, model, n)
    tendon = tendon[WARM_UP:]
    ms = [1000 * x for x in tendon]
    direct_ms = [1000 * x for x in direct]
    added = median(ms) - median(direct_ms)
    writes = 1000 * median([float(e) for e in entries[WARM_UP:]]) / TOKENS
    return Result(
        rows=[
            Row(
                "ttft",
                "first token to subscriber, p50",
                "ms",
                tendon=median(ms),
                floor=median(direct_ms),
                note="floor: the openai client reading the model server directly",
            ),  # fmt: skip
            Row("ttft", "first token to subscriber, p95", "ms", tendon=pct(ms, 95), floor=pct(direct_ms, 95)),
            Row("ttft", "added by Tendon, p50", "ms", tendon=added, target="<= 5"),
            Row(
                "ttft",
                "journal entries per 1,000 streamed tokens",
                "entries",
                tendon=writes,
                note="previews are never stored: a turn's entries whatever its length",
            ),  # fmt: skip
        ],
        series={"ttft_ms": ms, "ttft_direct_ms": direct_ms},
    )
