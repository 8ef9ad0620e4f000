"""What the framework-tool tests' tools share: a run log across processes, a returned model.

Every body appends a line to the file named by ``FW_TEST_LOG`` (read at each call), so a test
counts what ran across the processes it kills.
"""

from __future__ import annotations

import json
import os
from typing import Any

from pydantic import BaseModel


def note(tool: str, **fields: Any) -> None:
    path = os.environ.get("FW_TEST_LOG")
    if path:
        with open(path, "a") as log:
            log.write(json.dumps({"tool": tool, **fields}) + "\n")


def noted(tool: str) -> list[dict[str, Any]]:
    path = os.environ.get("FW_TEST_LOG") or ""
    if not os.path.exists(path):
        return []
    with open(path) as log:
        return [r for r in map(json.loads, log) if r["tool"] == tool]


class Answer(BaseModel):
    key: str
    value: str
