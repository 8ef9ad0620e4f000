"""LangGraph run webhooks: a Brain loop that POSTs a run's LangGraph view to the URL its client
gave, once the run's turn ended or stopped at an interrupt.

The webhook's row is committed with the run's (``brain.store.langgraph``), so nothing waits in
memory (invariant 11): any Brain's look finds a due one, takes it for a lease (moving its next
try on, so that another Brain passes it by), POSTs, and records the try. A 2xx delivers it; any
other answer, or none within the timeout, is tried again after a doubling delay, and given up
after ``WEBHOOK_ATTEMPTS`` tries with ``turn.webhook_failed`` in the turn's journal (invariant 15).
A Brain that dies between its POST and its record leaves the webhook to be tried again after the
lease: delivery is at least once, as LangGraph's is.
"""

from __future__ import annotations

import aiohttp
import structlog

from brain.rules import facts
from brain.rules.langgraph import WEBHOOK_ATTEMPTS, webhook_delay, webhook_payload
from brain.rules.submits import shown_session
from brain.run.context import BrainContext
from infra.db import Connection, Row
from infra.process.loops import BackgroundLoop

log = structlog.get_logger("tendon.brain")
BATCH = 20
TIMEOUT = 10.0  # seconds a receiver has to answer one POST
LEASE = 3 * TIMEOUT  # a taken webhook is passed by for this long


class WebhookLoop:
    def __init__(self, ctx: BrainContext, interval: float) -> None:
        self.ctx = ctx
        self.interval = interval

    async def deliver_due(self) -> int:
        """One look: try every webhook due now; how many were tried."""
        store = self.ctx.store
        rows = await store.read(lambda conn: store.langgraph.due_webhooks(conn, BATCH))
        if not rows:
            return 0
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as http:
            return sum([await self._try(http, r) for r in rows])

    async def _try(self, http: aiohttp.ClientSession, r: Row) -> int:
        """Take one webhook, POST it, record the try; 1 when it was tried (0: another Brain took it)."""
        store = self.ctx.store

        async def take(conn: Connection) -> bool:
            return await store.langgraph.take_webhook(conn, r["run_id"], r["attempts"], LEASE)

        if not await store.transact(take):
            return 0
        error = await _post(
            http, r["url"], webhook_payload(r, shown_session(r["namespace"], r["session_id"]))
        )

        async def record(conn: Connection) -> None:
            await self._record(conn, r, error)

        await store.transact(record)
        return 1

    async def _record(self, conn: Connection, r: Row, error: str | None) -> None:
        attempts = int(r["attempts"]) + 1
        store = self.ctx.store
        if error is None:
            await store.langgraph.webhook_tried(conn, r["run_id"], "delivered", None, 0.0)
            log.info("webhook_delivered", run_id=r["run_id"], attempts=attempts)
        elif attempts >= WEBHOOK_ATTEMPTS:
            await store.langgraph.webhook_tried(conn, r["run_id"], "failed", error, 0.0)
            fact = facts.webhook_failed(r["run_id"], r["url"], attempts, error)
            await store.journal.append(conn, r["session_id"], r["turn_id"], [fact])
            log.warning("webhook_failed", run_id=r["run_id"], attempts=attempts, error=error)
        else:
            delay = webhook_delay(attempts, self.interval)
            await store.langgraph.webhook_tried(conn, r["run_id"], "pending", error, delay)
            log.info("webhook_retry", run_id=r["run_id"], attempts=attempts, delay=delay, error=error)

    async def run(self) -> None:
        await BackgroundLoop("webhooks", self.deliver_due, period=self.interval).run()


async def _post(http: aiohttp.ClientSession, url: str, payload: dict[str, object]) -> str | None:
    """None when the receiver took it (a 2xx), else why not (in one line)."""
    try:
        async with http.post(url, json=payload, allow_redirects=False) as answer:
            if 200 <= answer.status < 300:
                return None
            return f"HTTP {answer.status}"
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        return f"{type(exc).__name__}: {str(exc)[:200]}"
