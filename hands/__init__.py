"""Tendon Hands: a pool of workers that run one route's tools durably.

Tool authors need only the declaration API::

    from hands import Found, NotFound, ToolContext, tool

The pool itself is ``hands serve`` (:class:`HandsApp`); its ledger, replay rule and state
machine are exported for tests and operators.
"""

from hands.app import HandsApp
from hands.rules.replay import Decision, Recovery, decide
from hands.rules.states import LedgerStatus, transition
from hands.run.reconcile import Reconciliation, reconcile
from hands.tools.declare import Found, NotFound, OutputWriter, Tool, ToolContext, tool
from hands.tools.registry import ToolLoadError, ToolRegistry, load_tools

__all__ = [
    "Decision",
    "Found",
    "HandsApp",
    "LedgerStatus",
    "NotFound",
    "OutputWriter",
    "Reconciliation",
    "Recovery",
    "Tool",
    "ToolContext",
    "ToolLoadError",
    "ToolRegistry",
    "decide",
    "load_tools",
    "reconcile",
    "tool",
    "transition",
]
