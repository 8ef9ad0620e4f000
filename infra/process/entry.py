"""The ``brain`` and ``hands`` commands' first steps, before anything heavy is imported.

Loading the program takes a few hundred milliseconds; a Ctrl-C then, or a closed output (``|
head``) later, ends it with one line on stderr and a documented exit code, never a traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT
EXIT_OUTPUT_CLOSED = 141  # the reader of the output went away, as shells report SIGPIPE


def run(command: str, module: str) -> int:
    """Import ``module`` and run its ``main`` as ``command``; Ctrl-C and a closed output end it
    cleanly."""
    try:
        return int(importlib.import_module(module).main())
    except KeyboardInterrupt:
        print(f"\n{command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return output_closed(command)
    except Exception as exc:
        if not interrupted(exc):
            raise
        print(f"\n{command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine to its end on uvloop's event loop (asyncio's own where uvloop
    is not installed, as on Windows). The loop's own work (scheduling tasks, socket reads and
    writes) is a good part of what a call costs: on uvloop, 8 % more calls/s at 50 in flight and
    3 % less latency for a lone turn (docs/benchmarks/NOTES.md, twentieth round).

    A Ctrl-C that comes before the loop started ``main`` (while uvloop loads, say) closes it, so
    that the one line the command prints is not followed by "coroutine was never awaited"."""
    try:
        try:
            import uvloop
        except ImportError:
            import asyncio

            return asyncio.run(main)
        return uvloop.run(main)
    except BaseException:
        main.close()  # a no-op for one that ran
        raise


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is a Ctrl-C in disguise: pydantic-core reports one that lands while it
    builds a model's schema (as modules load) as a ``SchemaError`` naming ``KeyboardInterrupt``."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        if type(seen).__name__ == "SchemaError" and "KeyboardInterrupt" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def output_closed(command: str) -> int:
    """The output's reader went away: say so once, and keep the interpreter's final flush of
    stdout from failing again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    print(f"{command}: stopped: the output was closed (broken pipe)", file=sys.stderr)
    return EXIT_OUTPUT_CLOSED


def brain() -> int:
    # The whole system's wiring is above Brain and Hands: it offers `brain demo` and `--local`.
    return run("brain", "local.cli")


def hands() -> int:
    return run("hands", "hands.cli")
