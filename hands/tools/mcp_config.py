"""Which MCP servers a Hands pool serves, from ``--mcp`` specs or a ``--mcp-config`` file.

    hands serve --route files --mcp 'stdio:python -m my_server'
    hands serve --route billing --mcp 'http://127.0.0.1:9000/mcp'
    hands serve --route billing --mcp-config mcp.json

A config file is JSON::

    {"servers": {
        "files": {"command": ["python", "-m", "my_server"], "env": {"ROOT": "/srv"}},
        "billing": {"url": "https://billing.example/mcp",
                    "headers_from_env": {"Authorization": "BILLING_AUTH"},
                    "connections": 2, "relist_seconds": 300,
                    "tools": {"refund": {"replay": "unsafe"}}}}}

Header values are read from the named environment variables when a connection is opened, never
written to the config, the bindings or the ledger. ``tools`` overrides the replay policy the
server's annotations imply, per tool. ``relist_seconds`` lists the server's tools again that often,
for a server that does not say when they change (``--mcp-relist SECONDS`` for the ``--mcp`` ones).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protocol import ReplayPolicy, TendonError


class McpConfigError(TendonError):
    """An ``--mcp`` spec or ``--mcp-config`` file that cannot be used."""

    code = "mcp_config_error"


@dataclass(frozen=True)
class McpServerSpec:
    """One MCP server: a command line (stdio) or a URL (Streamable HTTP)."""

    name: str
    command: tuple[str, ...] = ()
    url: str = ""
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    headers_from_env: dict[str, str] = field(default_factory=dict)
    connections: int = 1
    replay: dict[str, ReplayPolicy] = field(default_factory=dict)  # per-tool overrides
    relist_seconds: float | None = None  # list its tools again this often (None: when it says so)

    @property
    def where(self) -> str:
        """How the server is reached, for messages (never a header value)."""
        return self.url or shlex.join(self.command)


def parse_spec(spec: str, *, name: str = "mcp", relist: float | None = None) -> McpServerSpec:
    """``stdio:COMMAND LINE`` or an ``http(s)://`` URL, as given to ``--mcp``; ``relist``: its
    ``relist_seconds`` (``--mcp-relist``)."""
    if spec.startswith("stdio:"):
        command = tuple(shlex.split(spec.removeprefix("stdio:")))
        if not command:
            raise McpConfigError(f"--mcp {spec!r} names no command after stdio:")
        return McpServerSpec(name=name, command=command, relist_seconds=relist)
    if spec.startswith(("http://", "https://")):
        return McpServerSpec(name=name, url=spec, relist_seconds=relist)
    raise McpConfigError(
        f"--mcp {spec!r} is neither 'stdio:COMMAND LINE' nor an http(s):// URL of a Streamable HTTP server"
    )


def _strings(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise McpConfigError(f"{what} must be an object of strings")
    return {str(k): v for k, v in value.items()}


def _server(name: str, entry: Any, source: str) -> McpServerSpec:
    where = f"server {name!r} in {source}"
    if not isinstance(entry, dict):
        raise McpConfigError(f"{where} must be an object")
    unknown = set(entry) - {
        "command", "url", "env", "cwd", "headers_from_env", "connections", "tools", "relist_seconds",
    }  # fmt: skip
    if unknown:
        raise McpConfigError(f"{where} has unknown keys: {', '.join(sorted(unknown))}")
    command, url = entry.get("command"), entry.get("url")
    if (command is None) == (url is None):
        raise McpConfigError(f"{where} needs exactly one of command (a list) or url")
    if command is not None and (not isinstance(command, list) or not command):
        raise McpConfigError(f"{where}: command must be a non-empty list of strings")
    connections = entry.get("connections", 1)
    if not isinstance(connections, int) or not 1 <= connections <= 64:
        raise McpConfigError(f"{where}: connections must be an integer from 1 to 64")
    relist = entry.get("relist_seconds")
    if relist is not None and (isinstance(relist, bool) or not isinstance(relist, int | float) or relist < 1):
        raise McpConfigError(f"{where}: relist_seconds must be a number of seconds, at least 1")
    replay: dict[str, ReplayPolicy] = {}
    for tool, override in dict(entry.get("tools") or {}).items():
        try:
            replay[tool] = ReplayPolicy(override["replay"])
        except (KeyError, TypeError, ValueError):
            raise McpConfigError(f'{where}: tools.{tool} must be {{"replay": "safe" | "unsafe"}}') from None
    return McpServerSpec(
        name=name,
        command=tuple(str(c) for c in command or ()),
        url=str(url or ""),
        env=_strings(entry.get("env", {}), f"{where}: env"),
        cwd=entry.get("cwd"),
        headers_from_env=_strings(entry.get("headers_from_env", {}), f"{where}: headers_from_env"),
        connections=connections,
        replay=replay,
        relist_seconds=float(relist) if relist is not None else None,
    )


def load_config(path: str) -> list[McpServerSpec]:
    """The servers a ``--mcp-config`` file lists."""
    try:
        document = json.loads(Path(path).read_text())
    except OSError as exc:
        raise McpConfigError(f"cannot read --mcp-config {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise McpConfigError(f"--mcp-config {path} is not JSON: {exc}") from exc
    servers = document.get("servers") if isinstance(document, dict) else None
    if not isinstance(servers, dict) or not servers:
        raise McpConfigError(f'--mcp-config {path} lists no servers (expected {{"servers": {{NAME: ...}}}})')
    return [_server(name, entry, path) for name, entry in servers.items()]


def server_specs(specs: list[str], config: str | None, relist: float | None = None) -> list[McpServerSpec]:
    """Every server of the ``--mcp`` specs and the ``--mcp-config`` file, names unique.
    ``relist``: the ``relist_seconds`` of every ``--mcp`` server (``--mcp-relist``; a config file's
    servers say their own)."""
    if relist is not None and not relist >= 1:  # NaN too
        raise McpConfigError(f"--mcp-relist {relist:g} must be a number of seconds, at least 1")
    if relist is not None and not specs:
        raise McpConfigError("--mcp-relist is for --mcp servers (a config file's say relist_seconds)")
    many = len(specs) > 1
    servers = [
        parse_spec(s, name=f"mcp{i + 1}" if many else "mcp", relist=relist) for i, s in enumerate(specs)
    ]
    if config:
        servers += load_config(config)
    names = [s.name for s in servers]
    if len(set(names)) != len(names):
        raise McpConfigError(f"two MCP servers share a name: {', '.join(sorted(names))}")
    return servers
