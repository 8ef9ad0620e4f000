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
from hands.tools.mcp_config import McpServerSpec, server_specs
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
        mcp = mcp_servers(args.mcp, args.mcp_config, args.mcp_relist)
        data = DataDir(args.data_dir or Path(".tendon/local"))
        if "http" not in settings.model_fields_set:  # asked for: an address in use is an error
            settings = settings.model_copy(update={"http": settings.http})
        killpoints = KillPoints(settings.kill_at)
        # A development server: an edited agent file is taken under its name (no CONFLICT).
        async with run_local(
            settings, data, pools=pools, killpoints=killpoints, follows_edits=True, mcp=mcp
        ) as system:
            started = asyncio.create_task(system.ready.wait())
            await asyncio.wait([started, system.brain_task], return_when=asyncio.FIRST_COMPLETED)
            started.cancel()
            print(
                f"tendon: serving {data.root} with pools {', '.join(h.route for h in system.hands) or 'none'}"
                + (f"; the console at http://{system.http}/console" if system.http else ""),
                file=sys.stderr,
                flush=True,
            )
            waiting = asyncio.create_task(stop.wait())
            await asyncio.wait([waiting, system.brain_task], return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
        return 0


def _route_and(value: str, flag: str) -> tuple[str, str]:
    route, sep, rest = value.partition("=")
    if not sep or not route or not rest:
        raise SchemaError(
            f"{flag} {value!r} is not ROUTE=... (the route whose pool serves the server's tools)"
        )
    return route, rest


def mcp_servers(
    specs: list[str], configs: list[str], relist: float | None = None
) -> dict[str, list[McpServerSpec]]:
    """The MCP servers of each route, from ``--mcp ROUTE=SPEC`` and ``--mcp-config ROUTE=FILE``;
    ``relist``: ``--mcp-relist`` (for the ``--mcp`` ones)."""
    given: dict[str, tuple[list[str], str | None]] = {}
    for value in specs:
        route, spec = _route_and(value, "--mcp")
        given.setdefault(route, ([], None))[0].append(spec)
    for value in configs:
        route, path = _route_and(value, "--mcp-config")
        mine, earlier = given.get(route, ([], None))
        if earlier is not None:
            raise SchemaError(f"route {route} has two --mcp-config files: list its servers in one")
        given[route] = (mine, path)
    if relist is not None and not specs:
        raise SchemaError("--mcp-relist is for --mcp servers (a config file's say relist_seconds)")
    return {
        route: server_specs(mine, path, relist if mine else None) for route, (mine, path) in given.items()
    }


def main(argv: list[str] | None = None) -> int:
    return brain_main(argv, local=LocalSystem())


if __name__ == "__main__":
    sys.exit(main())
