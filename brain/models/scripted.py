"""A deterministic model for tests and the demo; its script is data in the agent definition.

    "model": {"kind": "scripted", "script": [
        {"tool_calls": [{"tool": "send_email", "args": {...}}]},
        {"content": "Sent these notices:\n{results}"}]}

The reply for a turn is the script entry at the number of assistant replies already in that
turn's history, so a restarted Brain asks again and gets the same answer. ``{results}`` in
content is replaced by one line per tool result of the turn. Call ids are ``call-N``,
numbered across the turn. ``"delay": SECONDS`` in an entry makes that reply take so long, as a
slow model would (tests of leases and of faults during a model call); ``"gate": PATH`` makes it
wait until that file exists (a test that must act during the call, however slow its machine);
``"error": MESSAGE`` makes it fail, retryable unless ``"retryable": false`` (tests of the retry
policy); ``"usage": {...}`` is the reply's token usage (``{"steps": 1}`` without it).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from brain.models.base import Message, ModelReply, OnDelta, ToolCall
from protocol import ModelError, SchemaError


class ScriptedModel:
    def __init__(self, script: list[dict[str, Any]]) -> None:
        if not script:
            raise SchemaError("a scripted model needs a non-empty `script`")
        self.script = script

    async def complete(
        self,
        *,
        instructions: str,
        history: list[Message],
        turn_id: str,
        tools: list[dict[str, Any]],
        on_delta: OnDelta | None = None,
    ) -> ModelReply:
        mine = [m for m in history if m.turn_id == turn_id]
        replies = sum(1 for m in mine if m.role == "assistant")
        if replies >= len(self.script):
            return ModelReply(content="(script exhausted)")
        entry = self.script[replies]
        if entry.get("delay"):
            await asyncio.sleep(float(entry["delay"]))
        if entry.get("gate"):
            # A file another process creates: there is nothing to wait on but time.
            while not await asyncio.to_thread(Path(entry["gate"]).exists):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        if "error" in entry:
            raise ModelError(str(entry["error"]), retryable=bool(entry.get("retryable", True)))
        calls_so_far = sum(len(m.content.get("tool_calls", [])) for m in mine if m.role == "assistant")
        if "tool_calls" in entry:
            calls = [
                ToolCall(call_id=f"call-{calls_so_far + i + 1}", tool=c["tool"], args=c.get("args", {}))
                for i, c in enumerate(entry["tool_calls"])
            ]
            return ModelReply(tool_calls=calls, usage=entry.get("usage", {"steps": 1}))
        content = str(entry.get("content", ""))
        if "{results}" in content:
            lines = [
                f"- {m.content['call_id']}: {json.dumps(m.content.get('result'), sort_keys=True)}"
                for m in mine
                if m.role == "tool"
            ]
            content = content.replace("{results}", "\n".join(lines))
        return ModelReply(content=content, usage=entry.get("usage", {"steps": 1}))
