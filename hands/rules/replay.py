"""The replay rule (DESIGN invariant 6) as one pure function.

When the owner of an open execution is dead, recovery asks :func:`decide` what to do:

| status at crash        | safe at intent and now | has query (tool served) | decision |
| ---------------------- | ---------------------- | ----------------------- | -------- |
| ACCEPTED               | any                    | any                     | START    |
| RUNNING / QUERYING     | any, with a handle     | any (a version served)  | REATTACH |
| RUNNING / QUERYING     | yes                    | any                     | RERUN    |
| RUNNING / QUERYING     | no                     | yes                     | QUERY    |
| RUNNING / QUERYING     | no                     | no                      | UNKNOWN  |

"With a handle": the body committed a durable handle (an MCP task id) before waiting on the
operation, and a tool served can re-attach by it: the operation is followed, never started
again, whatever the policy. Following never calls the tool, so the binding need not be the one
frozen: a newer version of the same tool (an MCP server whose listing changed while the task was
parked) follows it as well, and the caller says so with ``has_handle``.

ACCEPTED means the body never started, so running it now is the first run whatever the
policy says. Anything else is a crash *inside* the body (or inside the query that followed
one): re-running is allowed only when the tool was declared safe when the intent was
committed *and* is still safe now; otherwise its query asks the external system about the
original operation, and without a query nothing is guessed: UNKNOWN.

"Now" is the binding this pool serves under the digest the Brain froze; a tool that is no
longer served (``policy_now is None``) can be neither re-run nor queried.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from hands.rules.states import LedgerStatus
from protocol import IllegalTransitionError, ReplayPolicy


class Recovery(StrEnum):
    """What recovery does with an execution whose owner died."""

    START = "start"  # the body never started: run it (first run)
    RERUN = "rerun"  # safe then and now: run it again as a new attempt
    REATTACH = "reattach"  # follow the operation by the handle its body kept
    QUERY = "query"  # ask the tool's query about the original operation
    UNKNOWN = "unknown"  # cannot know: wait for a reconcile


@dataclass(frozen=True)
class Decision:
    """A recovery decision and the sentence that explains it (it ends up in events and logs)."""

    action: Recovery
    reason: str


def decide(
    status: LedgerStatus | str,
    policy_at_intent: ReplayPolicy | str,
    policy_now: ReplayPolicy | str | None,
    has_query: bool,
    *,
    tool: str = "the tool",
    has_handle: bool = False,
) -> Decision:
    """Decide how to recover an open execution whose owner died (see the module table).

    Raises IllegalTransitionError for a status that needs no recovery (terminal, UNKNOWN).
    """
    status = LedgerStatus(status)
    intent = ReplayPolicy(policy_at_intent)
    now = ReplayPolicy(policy_now) if policy_now is not None else None
    if status is LedgerStatus.ACCEPTED:
        return Decision(Recovery.START, f"{tool} was accepted but its body never started")
    if status not in (LedgerStatus.RUNNING, LedgerStatus.QUERYING):
        raise IllegalTransitionError(f"an execution in status {status.value.upper()} needs no recovery")
    where = "inside the query" if status is LedgerStatus.QUERYING else "inside the body"
    if has_handle:
        return Decision(
            Recovery.REATTACH,
            f"worker died {where} of {tool} after it kept a durable handle; re-attaching by it",
        )
    if now is None:
        return Decision(
            Recovery.UNKNOWN,
            f"worker died {where} of {tool}, whose binding is no longer served by this pool, "
            "so it can be neither re-run nor queried",
        )
    if intent is ReplayPolicy.SAFE and now is ReplayPolicy.SAFE:
        return Decision(Recovery.RERUN, f"worker died {where} of safe tool {tool}; running it again")
    # From here on re-running is forbidden; say which half of the rule forbade it.
    why = (
        f"unsafe tool {tool}"
        if intent is ReplayPolicy.UNSAFE
        else f"tool {tool}, declared safe at intent but unsafe now"
    )
    if has_query:
        return Decision(
            Recovery.QUERY,
            f"worker died {where} of {why}; asking its query about the original operation",
        )
    return Decision(Recovery.UNKNOWN, f"worker died {where} of {why}, which has no query")
