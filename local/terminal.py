"""The demo's terminal: one line it redraws (the progress bar) among the lines it prints, and
whatever else writes to the same terminal (a kill point's last words, a warning logged, the line a
Ctrl-C leaves) erasing that line first, so that nothing is written after the bar on its line."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TextIO

ERASE = "\r\033[K"  # back to the start of the line, and clear it


@dataclass
class Progress:
    """A line redrawn in place on a terminal (``tty``); nothing at all elsewhere."""

    out: TextIO
    tty: bool
    drawn: bool = False
    text: str = ""

    def draw(self, text: str) -> None:
        if self.tty and not (self.drawn and text == self.text):  # unchanged: not drawn again
            print(f"{ERASE}{text}", end="", file=self.out, flush=True)
            self.drawn, self.text = True, text

    def erase(self) -> None:
        """Before anything else is written: the line is cleared, the cursor at its start."""
        if self.drawn:
            print(ERASE, end="", file=self.out, flush=True)
            self.drawn = False


class Erasing(io.TextIOBase):
    """A stream (stderr) that erases ``progress`` before each write: what it writes starts on a
    line of its own."""

    def __init__(self, stream: TextIO, progress: Progress) -> None:
        super().__init__()
        self.stream, self.progress = stream, progress

    def write(self, text: str) -> int:
        if text:
            self.progress.erase()
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.stream.encoding
