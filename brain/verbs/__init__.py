"""The verbs room: what users ask the Brain to do, over its store, one place for the CLI and the
HTTP API (``sessions``: submit, threads, turns, history, close; ``controls``: controls and answers;
``reconcile``: an operator's reconcile, sent to the Hands of the execution's route; ``describe``: a
turn as shown; ``observe``: a session's journal as events)."""

from brain.verbs.sessions import (
    check_thread_name,
    close,
    history,
    submit,
    threads,
    turns,
    unserved_tools,
)

__all__ = ["check_thread_name", "close", "history", "submit", "threads", "turns", "unserved_tools"]
