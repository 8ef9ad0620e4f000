"""The verbs room: what users ask the Brain to do, over its store, one place for the CLI and the
HTTP API (``sessions``: submit, threads, turns, history, close; ``controls``: controls and answers;
``reconcile``: an operator's reconcile, sent to the Hands of the execution's route; ``describe``: a
turn as shown; ``observe``: a session's journal as events; ``tools``: which tools a submit may
name; ``browse``: what the console lists, the sessions of a namespace, a tool's output, and for
operators the UNKNOWN executions and the routes)."""

from brain.verbs.sessions import (
    check_thread_name,
    close,
    history,
    submit,
    threads,
    turns,
)
from brain.verbs.tools import KnownTools

__all__ = ["KnownTools", "check_thread_name", "close", "history", "submit", "threads", "turns"]
