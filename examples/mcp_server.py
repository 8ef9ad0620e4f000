"""An MCP server (the official SDK's server side) whose calls a Tendon Hands pool makes durable:

    hands serve --route notes --mcp 'stdio:python -m examples.mcp_server --file notes.jsonl'

``read_notes`` is annotated read-only, so Tendon runs it again after a crash. ``add_note`` changes
something: it uses the operation id Tendon sends in the request's ``_meta`` as its idempotency
key, and declares the Tendon durable extension in its own ``_meta``, so that after a crash the
pool asks ``find_note`` whether the note was added instead of adding it twice (or leaving the
call UNKNOWN). The notes live in a file, so they outlive the server's process.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

app = MCPServer("notes")
NOTES = Path("notes.jsonl")


def notes() -> list[dict[str, Any]]:
    return [json.loads(line) for line in NOTES.read_text().splitlines()] if NOTES.exists() else []


@app.tool(annotations=ToolAnnotations(readOnlyHint=True))
def read_notes() -> list[str]:
    """Every note, oldest first."""
    return [n["text"] for n in notes()]


@app.tool(meta={"io.tendon/durable": {"query": "find_note"}})
def add_note(text: str, ctx: Context) -> dict[str, Any]:
    """Add a note; adding it again under the same operation id adds nothing."""
    operation = str((ctx.request_context.meta or {}).get("io.tendon/operation_id", ""))
    for note in notes():
        if operation and note["operation"] == operation:
            return {"number": note["number"], "text": note["text"]}
    note = {"number": len(notes()) + 1, "text": text, "operation": operation}
    with NOTES.open("a") as f:
        f.write(json.dumps(note) + "\n")
    return {"number": note["number"], "text": text}


@app.tool(annotations=ToolAnnotations(readOnlyHint=True))
def find_note(operation_id: str) -> dict[str, Any]:
    """Whether operation ``operation_id`` added a note (the query of the durable extension)."""
    for note in notes():
        if note["operation"] == operation_id:
            return {"found": True, "result": {"number": note["number"], "text": note["text"]}}
    return {"found": False}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the notes MCP server, over stdio")
    parser.add_argument("--file", default=str(NOTES), help="where the notes are kept")
    NOTES = Path(parser.parse_args().file)
    app.run()
