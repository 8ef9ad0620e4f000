"""What the session stream sends, as OpenAPI says it: the route answers ``text/event-stream``, and
each Server-Sent Event's ``data`` is one of the shapes below, told by its ``event`` name (or, with
``format=ag-ui``, an AG-UI event: https://docs.ag-ui.com). The shapes are flat (no references),
so that they stand inline in the route's response."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from brain.rules.facts import KINDS


class Fact(BaseModel):
    """One fact of a journal entry: its ``kind`` and the fields that kind carries."""

    model_config = ConfigDict(extra="allow")

    kind: str = Field(description="what happened: " + ", ".join(f"`{k}`" for k in KINDS), examples=[*KINDS])


class StreamEntry(BaseModel):
    """SSE `event: entry`, `id:` its seq: one committed journal entry (one commit about one turn)."""

    seq: int = Field(description="the entry's place in the session: the id to resume from")
    session_id: str
    thread: str = Field(description="the thread's name (`main` for a session's first)")
    turn_id: str | None
    run: int | None = Field(description="the lease epoch of the run that committed it, if a run did")
    status: str | None = Field(description="where the commit left the turn")
    phase: str | None
    facts: list[dict[str, Any]] = Field(description="the facts of the commit, in order (see Fact)")
    at: str | None = Field(description="when it was committed (ISO 8601)")


class StreamPreview(BaseModel):
    """SSE `event: preview` (with `previews=true`), no id: a piece of a model reply being streamed.
    Never stored or replayed: the committed reply (`turn.model_replied`, with the same `message_id`)
    is the truth, and a `message.superseded` fact voids the pieces of the attempt it names."""

    turn_id: str
    message_id: str = Field(description="the message's logical id, the same for every attempt")
    attempt: int = Field(description="which attempt of the model call streams it (1, 2...)")
    kind: Literal["text", "tool_args"]
    text: str
    call_id: str | None = None
    tool: str | None = None


class StreamResync(BaseModel):
    """SSE `event: resync`, no id: retention removed entries the stream had not sent; read a fresh
    snapshot, and follow on from its `cursor`."""

    reason: str
    cursor: int


def responses() -> dict[int | str, dict[str, Any]]:
    """The stream route's 200 answer for OpenAPI."""
    shapes = [m.model_json_schema() for m in (StreamEntry, StreamPreview, StreamResync, Fact)]
    return {
        200: {
            "description": "Server-Sent Events: `entry` (with its seq as id), `preview`, `resync`; each "
            "`data` is JSON of the shape its `event` names (the first three below; an entry's facts are "
            "of the fourth). With `format=ag-ui`, each `data` is an AG-UI event instead.",
            "content": {"text/event-stream": {"schema": {"anyOf": shapes}}},
        }
    }
