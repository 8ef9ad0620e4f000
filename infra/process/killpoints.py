"""Named kill points: places in the code path where a chaos test can SIGKILL the process.

Armed once at start-up from ``TENDON_KILL_AT`` (a comma-separated list of ``name`` or
``name@tag``); a tag narrows the point to one item, e.g. ``hands.after_tool_body@call-4``
dies only while running the tool call ``call-4``. Unarmed points cost one set lookup.
"""

from __future__ import annotations

import os
import signal
import sys


class KillPoints:
    """The armed kill points of this process."""

    def __init__(self, spec: str = "") -> None:
        self._armed: set[tuple[str, str | None]] = set()
        for item in filter(None, (part.strip() for part in spec.split(","))):
            name, _, tag = item.partition("@")
            self._armed.add((name, tag or None))

    def __bool__(self) -> bool:
        return bool(self._armed)

    def hit(self, name: str, tag: str | None = None) -> None:
        """Die here with SIGKILL if this point (or this point for this tag) is armed."""
        if not self._armed:
            return
        if (name, None) in self._armed or (tag is not None and (name, tag) in self._armed):
            # stderr is unbuffered: the line is out before the signal lands.
            print(f"tendon: kill point {name}@{tag} reached, SIGKILL", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
