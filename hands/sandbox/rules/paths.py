"""Paths inside a workspace: relative, never out of it, and never into the sandbox's own record
(``.tendon/``: the marker and the operation log) from a tool."""

from __future__ import annotations

import posixpath

from protocol import SchemaError

RECORD = ".tendon"


def inside(path: str) -> str:
    """``path`` normalised, relative to the workspace root; SchemaError if it leaves it."""
    if not path or "\x00" in path:
        raise SchemaError("a workspace path may not be empty or hold a NUL character")
    # A container's workspace is mounted at /workspace: its absolute paths are the same files.
    norm = posixpath.normpath(path.removeprefix("/workspace/"))
    if posixpath.isabs(norm) or norm == ".." or norm.startswith("../") or norm == ".":
        raise SchemaError(f"workspace path {path!r} is not inside the workspace (give a relative path)")
    return norm


def user_path(path: str) -> str:
    """:func:`inside`, and not in the sandbox's own record."""
    norm = inside(path)
    if norm == RECORD or norm.startswith(RECORD + "/"):
        raise SchemaError(f"workspace path {path!r} is the sandbox's own record ({RECORD}/)")
    return norm
