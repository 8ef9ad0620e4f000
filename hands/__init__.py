"""Tendon Hands: a pool of workers that run one route's tools durably.

Tool authors need only the declaration API::

    from hands import Found, NotFound, ToolContext, tool

The pool itself is ``hands serve`` (:class:`HandsApp`); its ledger, replay rule and state
machine are exported for tests and operators.
"""

from hands.app import HandsApp
from hands.reconcile import Reconciliation, reconcile
from hands.registry import ToolLoadError, ToolRegistry, load_tools
from hands.replay import Decision, Recovery, decide
from hands.states import LedgerStatus, transition
from hands.tools import Found, NotFound, OutputWriter, Tool, ToolContext, tool

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
