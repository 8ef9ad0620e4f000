"""The local POSIX backend: a sandbox is a directory under a root, its commands are processes of
the Hands' host, run as the Hands' user. It isolates NOTHING: a command can read and write
whatever the Hands process can. It is for development, and for tools you already trust.

The provider's labels are a file in the directory (``.tendon/labels.json``), written right after
the ``mkdir`` that takes the identity (two creations of one identity cannot both make it).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from hands.sandbox.backends.base import AlreadyExistsError
from hands.sandbox.rules.errors import SandboxGoneError
from hands.sandbox.rules.paths import inside

LABELS = ".tendon/labels.json"


class LocalBackend:
    kind = "local"

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

    def config(self) -> dict[str, Any]:
        return {"backend": "local", "root": str(self.root)}

    def _dir(self, identity: str) -> Path:
        return self.root / identity

    async def find(self, identity: str) -> dict[str, str] | None:
        where = self._dir(identity)
        if not where.is_dir():
            return None
        try:
            found = json.loads((where / LABELS).read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}

    async def create(self, identity: str, labels: dict[str, str]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self._dir(identity).mkdir()
        except FileExistsError as exc:
            raise AlreadyExistsError(f"{self._dir(identity)} exists already") from exc
        await self.write_file(identity, LABELS, json.dumps(labels).encode())

    async def resume(self, identity: str) -> None:
        if not self._dir(identity).is_dir():
            raise SandboxGoneError(f"sandbox directory {self._dir(identity)} is gone")

    async def delete(self, identity: str) -> None:
        await asyncio.to_thread(shutil.rmtree, self._dir(identity), ignore_errors=False, onerror=_gone_ok)

    async def shell(self, identity: str, script: str) -> tuple[int, bytes]:
        await self.resume(identity)
        # Python's subprocess in a thread, not the loop's: it closes every other descriptor in the
        # child (uvloop's leaves the pipe's socket open in a command the script starts in the
        # background, whose output then never ends).
        done = await asyncio.to_thread(
            subprocess.run, ["sh", "-c", script], cwd=self._dir(identity), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True, check=False,
        )  # fmt: skip
        return done.returncode, done.stdout

    async def write_file(self, identity: str, path: str, data: bytes) -> None:
        target = self._dir(identity) / inside(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        tmp.write_bytes(data)
        tmp.replace(target)

    async def read_file(self, identity: str, path: str, offset: int = 0, limit: int = -1) -> bytes | None:
        return await asyncio.to_thread(_read, self._dir(identity) / inside(path), offset, limit)


def _read(path: Path, offset: int, limit: int) -> bytes | None:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(limit)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def _gone_ok(fn: Any, path: str, exc_info: Any) -> None:
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]
