"""A Python client of the HTTP API, async (:class:`AsyncClient`) and sync (:class:`Client`).

    async with AsyncClient("http://127.0.0.1:8080", token) as tendon:
        turn = await tendon.submit("s1", "r1", "Send the notice", agent)
        async for event in tendon.events("s1"):          # follows live, resumes after a cut
            ...
        done = await tendon.call("s1", "r2", "And now?", agent)   # submit and wait

An error answer raises the same typed error the server raised (``NotFoundError``,
``ConflictError``...), with its message; a Brain it cannot reach raises ``TransientError``.
``events`` keeps the id of the last event it gave, and reconnects from there when the
connection drops: every event once, in order.

It speaks HTTP through aiohttp: a request costs its client about a tenth of the CPU httpx
spends on one (0.2 to 0.4 ms against 1.3 to 3 ms here, 1 to 50 requests in flight; see
docs/benchmarks/NOTES.md), and a client that submits many turns pays that on each. aiohttp is
imported when the first request is made, so a CLI verb that never speaks HTTP does not load it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    import aiohttp

from brain.rules.agents import AgentDefinition
from protocol import TransientError, error_of


def _raise_for(status: int, body: bytes) -> None:
    if status < 400:
        return
    try:
        error = json.loads(body)["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "http_error", f"HTTP {status}: {body[:300].decode(errors='replace')}"
    if status >= 500:
        raise TransientError(f"{code}: {message}")
    raise error_of(code, message)


def _id(value: str) -> str:
    """An id as one path segment: a ``/``, ``?`` or space in it is sent, not read as the URL's."""
    return quote(value, safe="")


def _agent(agent: AgentDefinition | dict[str, Any]) -> dict[str, Any]:
    return agent.model_dump(mode="json") if isinstance(agent, AgentDefinition) else dict(agent)


def _seconds(wait: float) -> str:
    """A wait as the API reads it: ``1.5s``, never ``1e-05s`` (milliseconds are the finest)."""
    return f"{wait:.3f}".rstrip("0").rstrip(".") + "s"


def _query(params: dict[str, Any]) -> dict[str, str]:
    """Query parameters as the API reads them (``true``/``false`` for flags)."""
    return {k: ("true" if v else "false") if isinstance(v, bool) else str(v) for k, v in params.items()}


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The lines of a body that arrives in chunks (``\n`` or ``\r\n`` ends a line)."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        *done, pending = pending.split(b"\n")
        for line in done:
            yield line.removesuffix(b"\r").decode()


class AsyncClient:
    """The HTTP API of a Tendon Brain, for asyncio code."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 90.0) -> None:
        self._url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout
        self._http: aiohttp.ClientSession | None = None  # made in the event loop, at first use

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            import aiohttp

            self._http = aiohttp.ClientSession(
                headers=self._headers, timeout=aiohttp.ClientTimeout(total=self._timeout)
            )
        return self._http

    async def _request(
        self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None
    ) -> Any:
        import aiohttp

        try:
            async with self._session().request(
                method, self._url + path, params=_query(params or {}), json=body
            ) as response:
                status, answer = response.status, await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            why = str(exc) or type(exc).__name__
            raise TransientError(f"cannot reach the Brain at {self._url}: {why}") from exc
        _raise_for(status, answer)
        return json.loads(answer)

    async def submit(
        self, session: str, request_id: str, text: str, agent: AgentDefinition | dict[str, Any], *,
        thread: str = "main", expect_tools: bool = False, multitask_strategy: str = "enqueue",
        metadata: dict[str, str] | None = None, thread_metadata: dict[str, str] | None = None,
    ) -> str:  # fmt: skip
        """Accept a turn durably; its id (the same for the same request id and input). An agent
        naming a tool no Hands pool announced raises UnknownToolError, unless ``expect_tools``.
        ``multitask_strategy``: what to do when the thread has an unfinished turn (reject, enqueue,
        interrupt or rollback: docs/design.md, "Double texting"). ``metadata``,
        ``thread_metadata``: string pairs set on the session and the thread."""
        found = await self.submitted(
            session, request_id, text, agent, thread=thread, expect_tools=expect_tools,
            multitask_strategy=multitask_strategy, metadata=metadata, thread_metadata=thread_metadata,
        )  # fmt: skip
        return str(found["turn_id"])

    async def submitted(
        self, session: str, request_id: str, text: str, agent: AgentDefinition | dict[str, Any], *,
        thread: str = "main", wait: float = 0, expect_tools: bool = False,
        multitask_strategy: str = "enqueue", metadata: dict[str, str] | None = None,
        thread_metadata: dict[str, str] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """:meth:`submit`, answering ``{"turn_id", "created"}`` (False: that request was known),
        and ``"warnings"`` when some of the agent's tools would not run now; with ``wait``, once
        the turn ended or that many seconds passed, with the turn as it stands under ``"turn"``."""
        body: dict[str, Any] = {"request_id": request_id, "input": text, "agent": _agent(agent)}
        body["thread"] = thread
        if expect_tools:
            body["expect_tools"] = True
        if multitask_strategy != "enqueue":  # what to do when the thread is busy
            body["multitask_strategy"] = multitask_strategy
        body.update({k: v for k, v in (("metadata", metadata), ("thread_metadata", thread_metadata)) if v})
        params = {"wait": _seconds(wait)} if wait else {}
        path = f"/v1/sessions/{_id(session)}/turns"
        return await self._request("POST", path, params=params, body=body)  # type: ignore[no-any-return]

    async def turn(self, turn_id: str, *, wait: float = 0) -> dict[str, Any]:
        """The turn as it stands (after waiting up to ``wait`` seconds for it to end)."""
        params = {"wait": _seconds(wait)} if wait else {}
        return await self._request("GET", f"/v1/turns/{_id(turn_id)}", params=params)  # type: ignore[no-any-return]

    async def call(
        self, session: str, request_id: str, text: str, agent: AgentDefinition | dict[str, Any], *,
        thread: str = "main", within: float = 600, expect_tools: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        """Submit and wait until the turn ended (or ``within`` seconds passed: the turn goes on).
        One request when the turn ends within its first wait (30 s at most)."""
        deadline = asyncio.get_running_loop().time() + within
        submitted = await self.submitted(
            session, request_id, text, agent, thread=thread, wait=max(0.001, min(30.0, within)),
            expect_tools=expect_tools,
        )  # fmt: skip
        found: dict[str, Any] = submitted["turn"]
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if found["status"] in ("completed", "failed", "cancelled") or left <= 0:
                return found
            found = await self.turn(submitted["turn_id"], wait=min(30.0, left))

    async def control(
        self, turn_id: str, kind: str, *, request_id: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        """steer (text), inject (text), withdraw (control_id), pause, resume (revision), cancel."""
        body = {"kind": kind, "request_id": request_id, **fields}
        return await self._request("POST", f"/v1/turns/{_id(turn_id)}/controls", body=body)  # type: ignore[no-any-return]

    async def respond(self, turn_id: str, call: str, decision: str, **fields: Any) -> dict[str, Any]:
        """approve, deny (reason) or result (result) for a call that waits for a person."""
        body = {"call": call, "decision": decision, **fields}
        return await self._request("POST", f"/v1/turns/{_id(turn_id)}/respond", body=body)  # type: ignore[no-any-return]

    async def signal(
        self, turn_id: str, key: str, payload: Any = None, *, request_id: str | None = None
    ) -> dict[str, Any]:
        """Signal ``key`` (under ``x.``) with ``payload`` to the turn's call that waits for it."""
        body = {"key": key, "payload": payload, "request_id": request_id}
        return await self._request("POST", f"/v1/turns/{turn_id}/signals", body=body)  # type: ignore[no-any-return]

    async def schedule(
        self, session: str, request_id: str, text: str, agent: AgentDefinition | dict[str, Any], *,
        cron: str | None = None, delay: float | None = None, thread: str = "main",
    ) -> dict[str, Any]:  # fmt: skip
        """A schedule (the same for the same request id and input): a turn into ``thread`` on
        ``cron`` (five fields, or six with the seconds last; UTC), or once ``delay`` seconds from now."""
        body = {"request_id": request_id, "session": session, "thread": thread, "agent": _agent(agent),
                "input": text, "cron": cron, "delay": delay}  # fmt: skip
        return await self._request("POST", "/v1/schedules", body=body)  # type: ignore[no-any-return]

    async def thread_action(self, action: str, thread: str, **params: Any) -> dict[str, Any]:
        """``fork`` or ``rewind`` a thread (by its id: ``session`` or ``session/name``)."""
        given = {k: v for k, v in params.items() if v is not None}
        return await self._request("POST", f"/v1/threads/{_id(thread)}/{action}", params=given)  # type: ignore[no-any-return]

    async def schedules(self, action: str = "list", schedule_id: str | None = None) -> Any:
        """``list`` the schedules, or ``pause``, ``resume`` or ``delete`` the one ``schedule_id`` names."""
        if action == "list":
            return await self._request("GET", "/v1/schedules")
        if action == "delete":
            return await self._request("DELETE", f"/v1/schedules/{schedule_id}")
        return await self._request("POST", f"/v1/schedules/{schedule_id}/{action}")

    async def reconcile(
        self, execution_id: str, *, evidence: str, actor: str, result: Any = None, failure: str | None = None
    ) -> dict[str, Any]:
        """An operator's resolution of an UNKNOWN execution: succeeded with ``result``, or failed
        with ``failure``, on ``evidence`` (an operator's token)."""
        body = {"evidence": evidence, "actor": actor, "result": result, "failure": failure}
        path = f"/v1/operator/executions/{_id(execution_id)}/reconcile"
        return await self._request("POST", path, body=body)  # type: ignore[no-any-return]

    async def receipts(self, turn_id: str) -> list[dict[str, Any]]:
        """The turn's controls and where each stands."""
        return await self._request("GET", f"/v1/turns/{_id(turn_id)}/controls")  # type: ignore[no-any-return]

    async def history(self, turn_id: str) -> dict[str, Any]:
        """The turn's runs, steps and model calls."""
        return await self._request("GET", f"/v1/turns/{_id(turn_id)}/history")  # type: ignore[no-any-return]

    async def sessions(
        self, *, search: str | None = None, limit: int = 20, after: str | None = None
    ) -> dict[str, Any]:
        """A page of the caller's sessions, newest first (``next``: the cursor of the page after)."""
        params = {
            k: v for k, v in {"search": search, "limit": limit, "after": after}.items() if v is not None
        }
        return await self._request("GET", "/v1/sessions", params=params)  # type: ignore[no-any-return]

    async def output(self, execution_id: str, *, offset: int = 0) -> dict[str, Any]:
        """What a tool wrote as it ran, from byte ``offset`` on (its ``pages``, and ``next``)."""
        path = f"/v1/executions/{_id(execution_id)}/output"
        return await self._request("GET", path, params={"offset": offset})  # type: ignore[no-any-return]

    async def threads(self, session: str) -> list[dict[str, Any]]:
        return await self._request("GET", f"/v1/sessions/{_id(session)}/threads")  # type: ignore[no-any-return]

    async def turns(
        self, session: str, *, limit: int = 50, after: int = 0, **where: Any
    ) -> list[dict[str, Any]]:
        """A session's turns in accepted order (``thread``, ``status``), a page after turn ``after``."""
        params = {"limit": limit, "after": after, **{k: v for k, v in where.items() if v is not None}}
        return await self._request("GET", f"/v1/sessions/{_id(session)}/turns", params=params)  # type: ignore[no-any-return]

    async def close_session(self, session: str, *, thread: str | None = None) -> bool:
        """Close a session (or one thread of it); False: it was closed already."""
        params = {"thread": thread} if thread else {}
        found = await self._request("POST", f"/v1/sessions/{_id(session)}/close", params=params)
        return bool(found["closed"])

    async def snapshot(self, session: str, **where: Any) -> dict[str, Any]:
        return await self._request("GET", f"/v1/sessions/{_id(session)}/snapshot", params=where)  # type: ignore[no-any-return]

    async def list_events(
        self, session: str, *, cursor: int = 0, limit: int = 500, **where: Any
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The session's events after ``cursor`` that are there now, a page at a time (no following)."""
        while True:
            params = {**where, "cursor": cursor, "limit": limit}
            page = await self._request("GET", f"/v1/sessions/{_id(session)}/events", params=params)
            for event in page["events"]:
                yield event
            if not page["events"] or page["cursor"] == cursor:
                return
            cursor = page["cursor"]

    async def events(
        self, session: str, *, cursor: int = 0, previews: bool = False, **where: Any
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Follow the session's events from ``cursor`` on, forever; reconnects after a cut from
        the last event it gave. Previews (with ``previews``) come as ``{"preview": ...}``."""
        import aiohttp

        params = _query({**where, "previews": previews})
        forever = aiohttp.ClientTimeout(total=None, sock_connect=10)
        last = cursor
        while True:
            try:
                async with self._session().get(
                    f"{self._url}/v1/sessions/{_id(session)}/stream", params=params,
                    headers={"Last-Event-ID": str(last)}, timeout=forever,
                ) as response:  # fmt: skip
                    if response.status >= 400:
                        _raise_for(response.status, await response.read())
                    async for kind, data, event_id in _sse(_lines(response.content.iter_any())):
                        if kind == "entry":
                            last = int(event_id or last)
                            yield json.loads(data)
                        elif kind == "preview":
                            yield {"preview": json.loads(data)}
                        elif kind == "resync":
                            last = int(json.loads(data)["cursor"])
                            yield {"resync": json.loads(data)}
            except (aiohttp.ClientError, TimeoutError):
                await asyncio.sleep(0.5)  # the connection dropped: follow again from the last event


async def _sse(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str, str, str | None]]:
    """(event, data, id) of a Server-Sent Events stream."""
    kind, data, event_id = "message", list[str](), None
    async for line in lines:
        if not line:
            if data:
                yield kind, "\n".join(data), event_id
            kind, data, event_id = "message", list[str](), None
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            kind = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            event_id = value


class Client:
    """The same, for code that is not async: each call runs the async client to completion."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 90.0) -> None:
        self._url, self._token, self._timeout = url, token, timeout

    def _run(self, method: str, *args: Any, **kwargs: Any) -> Any:
        async def go() -> Any:
            async with AsyncClient(self._url, self._token, timeout=self._timeout) as client:
                return await getattr(client, method)(*args, **kwargs)

        return asyncio.run(go())

    def submit(self, session: str, request_id: str, text: str, agent: Any, **kwargs: Any) -> str:
        """``thread``, ``expect_tools``, ``multitask_strategy``: as :meth:`AsyncClient.submit` takes them."""
        return str(self._run("submit", session, request_id, text, agent, **kwargs))

    def call(self, session: str, request_id: str, text: str, agent: Any, **kwargs: Any) -> dict[str, Any]:
        return self._run("call", session, request_id, text, agent, **kwargs)  # type: ignore[no-any-return]

    def turn(self, turn_id: str, *, wait: float = 0) -> dict[str, Any]:
        return self._run("turn", turn_id, wait=wait)  # type: ignore[no-any-return]

    def control(self, turn_id: str, kind: str, **fields: Any) -> dict[str, Any]:
        return self._run("control", turn_id, kind, **fields)  # type: ignore[no-any-return]

    def respond(self, turn_id: str, call: str, decision: str, **fields: Any) -> dict[str, Any]:
        return self._run("respond", turn_id, call, decision, **fields)  # type: ignore[no-any-return]

    def schedule(self, session: str, request_id: str, text: str, agent: Any, **fields: Any) -> dict[str, Any]:
        return self._run("schedule", session, request_id, text, agent, **fields)  # type: ignore[no-any-return]

    def schedules(self, action: str = "list", schedule_id: str | None = None) -> Any:
        return self._run("schedules", action, schedule_id)

    def signal(self, turn_id: str, key: str, payload: Any = None, **fields: Any) -> dict[str, Any]:
        return self._run("signal", turn_id, key, payload, **fields)  # type: ignore[no-any-return]

    def snapshot(self, session: str, **where: Any) -> dict[str, Any]:
        return self._run("snapshot", session, **where)  # type: ignore[no-any-return]

    def events(
        self, session: str, *, cursor: int = 0, limit: int = 500, **where: Any
    ) -> list[dict[str, Any]]:
        """Events after ``cursor`` that are there now (read a page at a time), without following."""

        async def pages() -> list[dict[str, Any]]:
            async with AsyncClient(self._url, self._token, timeout=self._timeout) as client:
                return [e async for e in client.list_events(session, cursor=cursor, limit=limit, **where)]

        return asyncio.run(pages())
