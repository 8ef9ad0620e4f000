"""The demo's data directory: what it keeps there (``--fresh`` removes these and nothing else),
and the command that goes on with the story where an earlier run stopped."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from local.embedded import DataDir, exclusive

# What the demo keeps in its data directory; --fresh removes these and nothing else.
OWNED = (
    "brain.sqlite3*",
    "hands.sqlite3*",
    "queue.sqlite3*",
    "objects",
    "mailbox.json",
    ".mailbox.json*",
    "timeline.seen*",
    "interrupted",
)
SEEN_FILE = "timeline.seen"
INTERRUPTED_FILE = "interrupted"  # left by a Ctrl-C: the next run resumes after an interruption, not a crash


def reset(data: DataDir) -> None:
    """``--fresh``: forget the demo's files in the data directory (refused while in use)."""
    if not data.root.exists():
        return
    with exclusive(data):
        for pattern in OWNED:
            for child in data.root.glob(pattern):
                shutil.rmtree(child) if child.is_dir() else child.unlink()


def resume_command(data_dir: Path | None, model: str | None) -> str:
    """The command that goes on with the story where it stopped (never ``--fresh``, which starts
    it over, nor ``--crash-at``, which would stop it again)."""
    words = ["brain", "demo"]
    words += ["--data-dir", str(data_dir)] if data_dir is not None else []
    if model is not None and model.startswith("agent:"):
        words += ["--agent", model.removeprefix("agent:")]
    elif model is not None:
        words += ["--model", model]
    return shlex.join(words)
