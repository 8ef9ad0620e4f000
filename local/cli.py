"""The ``brain`` command, with the whole system at hand: ``brain demo`` and ``brain serve --local``
run a Brain and Hands pools in one process, so they are wired here, above both; every other verb
is the Brain's own (``brain.face.cli``), which never imports the Hands."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from brain.face.cli import main as brain_main
from brain.face.commands import EXIT_USAGE
from hands.tools.registry import declared_routes
from infra.process.killpoints import KillPoints
from infra.process.settings import Settings
from local.embedded import DataDir, run_local
from protocol import SchemaError, TendonError


class LocalSystem:
    """What `brain demo` and `brain serve --local` run (``brain.face.commands.Local``)."""

    def demo(self, settings: Settings, args: argparse.Namespace) -> int:
        # The timeline is the output; logs only for what goes wrong (the demo sets them up).
        level = "WARNING" if "TENDON_LOG_LEVEL" not in os.environ else settings.log_level
        from local.demo import main_demo
        from local.demo_agents import AGENT_KIND

        if args.agent is not None and args.model is not None:
            print(
                "brain: --agent and --model cannot go together: a framework's agent asks its own model",
                file=sys.stderr,
            )
            return EXIT_USAGE

        try:
            return main_demo(
                settings, args.data_dir, fresh=args.fresh, crash_at=args.crash_at, log_level=level,
                model=args.model if args.agent is None else f"{AGENT_KIND}:{args.agent}",
            )  # fmt: skip
        except TendonError as exc:
            print(f"brain: {exc.message}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt:
            return 130

    async def serve(self, settings: Settings, args: argparse.Namespace, stop: asyncio.Event) -> int:
        """`brain serve --local`: everything in this process, on a data directory, until a signal."""
        pools = [(route, spec) for spec in args.tools for route in declared_routes(spec)]
        if len({route for route, _ in pools}) != len(pools):
            raise SchemaError(
                "two --tools modules declare tools for the same route: give one module per route"
            )
        data = DataDir(args.data_dir or Path(".tendon/local"))
        if "http" not in settings.model_fields_set:  # asked for: an address in use is an error
            settings = settings.model_copy(update={"http": settings.http})
        killpoints = KillPoints(settings.kill_at)
        # A development server: an edited agent file is taken under its name (no CONFLICT).
        async with run_local(
            settings, data, pools=pools, killpoints=killpoints, follows_edits=True
        ) as system:
            started = asyncio.create_task(system.ready.wait())
            await asyncio.wait([started, system.brain_task], return_when=asyncio.FIRST_COMPLETED)
            started.cancel()
            print(
                f"tendon: serving {data.root} with pools {', '.join(r for r, _ in pools) or 'none'}"
                + (f"; the console at http://{system.http}/console" if system.http else ""),
                file=sys.stderr,
                flush=True,
            )
            waiting = asyncio.create_task(stop.wait())
            await asyncio.wait([waiting, system.brain_task], return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
        return 0


def main(argv: list[str] | None = None) -> int:
    return brain_main(argv, local=LocalSystem())


if __name__ == "__main__":
    sys.exit(main())
