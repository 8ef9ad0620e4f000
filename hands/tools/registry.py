"""Loading the tools a Hands pool serves, and finding them again by name and binding digest.

``--tools`` names a module (``examples.email_tools``) or a file (``path/to/tools.py``); every
module-level :class:`~hands.tools.declare.Tool` whose route is the pool's route is served, and so
are the tools of the module's Pydantic AI and OpenAI Agents SDK agents (``hands.tools.frameworks``).
One name may be served in several versions at once (``@tool(name="greet", version="2")`` beside
version 1), so that an upgrade does not strand the threads pinned to the older one: a call names its
binding by digest, and the digest picks the version.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from hands.tools.declare import Tool
from protocol import RoutingError, TendonError, ToolBinding, version_key


class ToolLoadError(TendonError):
    """The ``--tools`` module could not be loaded, or serves nothing on this route."""

    code = "tool_load_error"


# The frameworks whose tools a module may hold, by the module that is missing without their extra.
EXTRAS = {"pydantic_ai": "pydantic-ai", "agents": "openai-agents"}


def _short(digest: str) -> str:
    return f"{digest[:8]}…"


class ToolRegistry:
    """The tools of one route, by name and version; a binding digest must match to be served."""

    def __init__(self, route: str, tools: Iterable[Tool]) -> None:
        self.route = route
        self._by_name: dict[str, dict[str, Tool]] = {}
        for t in tools:
            if t.binding.route != route:
                raise ToolLoadError(f"tool {t.name} belongs to route {t.binding.route}, not {route}")
            versions = self._by_name.setdefault(t.name, {})
            known = versions.get(t.binding.version)
            if known is not None and known is not t:
                raise ToolLoadError(
                    f"two tools named {t.name} in version {t.binding.version} are declared for route {route}"
                )
            versions[t.binding.version] = t

    def change(self, added: Iterable[Tool], removed: Iterable[Tool]) -> None:
        """Serve ``added`` from now on and stop serving ``removed`` (a source whose tools changed
        while the pool runs: an MCP server's). A command for a binding no longer served gets a
        routing error, never another version in its place."""
        for t in removed:
            versions = self._by_name.get(t.name, {})
            if versions.get(t.binding.version) is t:
                del versions[t.binding.version]
            if not versions:
                self._by_name.pop(t.name, None)
        for t in added:
            self._by_name.setdefault(t.name, {})[t.binding.version] = t

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_name.values())

    @property
    def names(self) -> list[str]:
        return sorted(self._by_name)

    @property
    def tools(self) -> list[Tool]:
        return [t for n in self.names for _, t in sorted(self._by_name[n].items())]

    @property
    def bindings(self) -> list[ToolBinding]:
        return [t.binding for n in self.names for _, t in sorted(self._by_name[n].items())]

    def get(self, name: str | None) -> Tool | None:
        """The newest version served under ``name`` (None if not served)."""
        versions = self._by_name.get(name or "")
        return versions[max(versions, key=version_key)] if versions else None

    def served(self, name: str | None, binding_digest: str | None) -> Tool | None:
        """The tool only if it is served under exactly this binding digest."""
        for t in self._by_name.get(name or "", {}).values():
            if t.binding.digest == binding_digest:
                return t
        return None

    def resolve(self, name: str, binding_digest: str) -> Tool:
        """The tool for a command, or RoutingError saying what this route serves instead."""
        versions = self._by_name.get(name)
        if not versions:
            raise RoutingError(
                f"tool {name} is not served by route {self.route} "
                f"(served: {', '.join(self.names) or 'nothing'})"
            )
        found = self.served(name, binding_digest)
        if found is None:
            served = ", ".join(
                f"{_short(t.binding.digest)} (version {v})" for v, t in sorted(versions.items())
            )
            raise RoutingError(
                f"binding digest {_short(binding_digest)} for tool {name} is not served by route "
                f"{self.route} (served: {served})"
            )
        return found


def _extra_hint(exc: Exception) -> str:
    """How to install the framework a module failed to import for want of it, if that is why."""
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    extra = EXTRAS.get((missing or "").partition(".")[0])
    return f" (install the {extra} extra: pip install 'tendon[{extra}]')" if extra else ""


def _import(spec: str) -> ModuleType:
    """Import ``spec`` as a file path if it looks like one, else as a dotted module name."""
    if spec.endswith(".py") or "/" in spec or os.sep in spec:
        path = Path(spec).resolve()
        if not path.is_file():
            raise ToolLoadError(f"tools file {spec} does not exist")
        name = f"_hands_tools_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ToolLoadError(f"cannot load tools file {spec}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # dataclasses and pydantic look their module up here
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise ToolLoadError(
                f"tools file {spec} failed to import: {type(exc).__name__}: {exc}{_extra_hint(exc)}"
            ) from exc
        return module
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        hint = _extra_hint(exc) or " (give a dotted module name on the Python path or a path to a .py file)"
        raise ToolLoadError(f"tools module {spec} cannot be imported: {exc}{hint}") from exc
    except Exception as exc:
        raise ToolLoadError(f"tools module {spec} failed to import: {type(exc).__name__}: {exc}") from exc


def _declared(module: ModuleType, spec: str) -> list[Tool]:
    """The module's ``@tool`` functions, then its agents' tools with their policies."""
    from hands.tools.frameworks import framework_tools

    return [v for v in vars(module).values() if isinstance(v, Tool)] + framework_tools(module, spec)


def declared_routes(spec: str) -> list[str]:
    """The routes the tools of ``spec`` are declared for (ToolLoadError if it declares none)."""
    routes = sorted({t.binding.route for t in _declared(_import(spec), spec)})
    if not routes:
        raise ToolLoadError(f"tools module {spec} declares no tools")
    return routes


def load_tools(spec: str, route: str) -> ToolRegistry:
    """Import ``spec`` and keep its tools declared for ``route``; ToolLoadError if none."""
    everything = _declared(_import(spec), spec)
    mine = [t for t in everything if t.binding.route == route]
    if not mine:
        others = sorted({t.binding.route for t in everything})
        hint = f"it declares tools for route(s) {', '.join(others)}" if others else "it declares no tools"
        raise ToolLoadError(f"tools module {spec} serves nothing on route {route}: {hint}")
    return ToolRegistry(route, mine)
