"""A LangGraph Agent Server compatible subset under ``/langgraph``: an unmodified ``langgraph-sdk``
client (``get_client(url="http://HOST/langgraph", api_key=TOKEN)``) runs, watches, interrupts and
resumes Tendon agents. The mapping (docs/langgraph.md says more):

===============  =====================================================================
LangGraph        Tendon
===============  =====================================================================
assistant        an agent of the namespace (graph id = its name), numbered versions each
                 naming an agent definition's version (``assistants``)
thread           a session; its runs go to the session's main thread; its metadata is
                 the session's (``threads``); its state and history are read from the
                 journal (``state``); a copy is a fork of its main thread into a new
                 session; its stream follows every run (``threadstream``)
run              a turn, or the same turn resumed by an answer (``runflow``); its stream
                 is the turn's journal entries (``runstream``, ``messages``)
interrupt        a call that waits for a person (an approval, a manual tool's result);
                 ``command.resume`` answers it
multitask        the submit's double-texting strategy (reject, enqueue, interrupt, rollback)
cron             a schedule on the thread (``crons``)
webhook          a row kept with the run's, POSTed by any Brain once it ended
                 (``brain.run.webhooks``)
auth             the /v1 bearer tokens (also as ``x-api-key``) and their namespaces
===============  =====================================================================

A graph's internals (``interrupt_before``, ``update_state``, checkpoints by object...) are
refused with a 422 ``not_supported`` naming the feature, never answered with something else.
"""

from brain.api.langgraph import assistants, crons, runs, threads, threadstream

# crons before runs: /runs/crons/... is a cron's path, not a run's
ROUTERS = [part.router for part in (assistants, threads, threadstream, crons, runs)]

__all__ = ["ROUTERS"]
