"""Agents written with a framework (an agent definition of kind python: ``framework`` and
``agent``), run durably by replaying the framework's own loop over the turn's journal
(``brain.frameworks.replay``; the rules a user's agent code follows: docs/frameworks.md).

One module per framework, each imported only when a turn needs it, so a Brain without the
optional extra (``pip install 'tendon[pydantic-ai]'``, ``'tendon[openai-agents]'``) runs every
other agent as before.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from brain.models.base import Message
from brain.rules.agents import AgentDefinition
from brain.run.context import BrainContext
from brain.store import TurnRow
from protocol import SchemaError

__all__ = ["forget", "load", "run_foreign"]

_LOADED: dict[str, Any] = {}


def load(path: str, allowed: tuple[str, ...] = ()) -> Any:
    """The framework's agent object at ``module:attribute`` (imported once per process), from one
    of the ``allowed`` modules or their submodules (none given: any module)."""
    module_name, _, attribute = path.partition(":")
    if allowed and not any(module_name == m or module_name.startswith(m + ".") for m in allowed):
        raise SchemaError(
            f"agent {path}: this Brain imports agents only from {', '.join(allowed)} (TENDON_AGENT_MODULES)"
        )
    found = _LOADED.get(path)
    if found is not None:
        return found
    try:
        found = importlib.import_module(module_name)
        for name in attribute.split("."):
            found = getattr(found, name)
    except ImportError as exc:
        raise SchemaError(f"agent {path} cannot be imported: {exc}") from exc
    except AttributeError as exc:
        raise SchemaError(f"agent {path}: module {module_name} has no {attribute}") from exc
    except Exception as exc:  # noqa: BLE001 - the user's module failed as it was imported
        raise SchemaError(f"agent {path} could not be loaded: {type(exc).__name__}: {exc}") from exc
    _LOADED[path] = found
    return found


def forget() -> None:
    """Load every agent afresh next time (its module imported again): for a process that runs
    agents of code that changed, as tests do."""
    for path in _LOADED:
        sys.modules.pop(path.partition(":")[0], None)
    _LOADED.clear()


async def run_foreign(
    ctx: BrainContext, row: TurnRow, agent: AgentDefinition, bindings: dict[str, Any], history: list[Message]
) -> TurnRow:
    """One run of a framework's turn: replay it up to where it stands, go on until it waits or
    ends, and return the turn as committed."""
    # Imported here: the adapters import the model client, which a Brain of JSON agents never needs.
    from brain.frameworks.replay import Replay, Suspended

    assert agent.agent is not None
    replay = Replay(ctx, row, agent, bindings, history)
    loaded = load(agent.agent, ctx.agent_modules)
    try:
        output = await _runner(agent.framework)(replay, loaded)
    except Suspended as suspended:
        return suspended.row
    except BaseExceptionGroup as group:  # a task group of the framework's: the run stopped on purpose
        stopped = next((e for e in group.exceptions if isinstance(e, Suspended)), None)
        if stopped is None:
            raise
        return stopped.row
    except Exception as exc:
        # The turn as this run last committed it (a reply may have gone on since the run began):
        # the run's end (a retry, a failure) is committed from there.
        exc.tendon_turn = replay.row  # type: ignore[attr-defined]
        raise
    jsonable = _jsonable(output)
    text = jsonable if isinstance(jsonable, str) else json.dumps(jsonable, ensure_ascii=False)
    return await replay.finish(text, jsonable)


def _runner(framework: str | None) -> Callable[[Any, Any], Awaitable[Any]]:
    """The adapter of ``framework`` (imported when a turn of it runs)."""
    if framework == "pydantic-ai":
        from brain.frameworks.pydanticai import run_turn as pydantic_ai_turn

        return pydantic_ai_turn
    from brain.frameworks.openaiagents import run_turn as openai_agents_turn

    return openai_agents_turn


def _jsonable(output: Any) -> Any:
    """The framework's output as JSON: text as it is, a model by its fields."""
    dump = getattr(output, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    try:
        return json.loads(json.dumps(output, default=str))
    except (TypeError, ValueError):
        return str(output)
