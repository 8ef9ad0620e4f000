"""The batch executor (a pure rule): one tool call, ``batch``, that runs a list of calls of one
Hands tool, ORDERED (one at a time, in order) or bounded PARALLEL (at most ``limit`` at once),
all-settled or fail-fast.

An agent names ``batch`` in its ``tools`` like a built-in wait; the Brain answers it itself. The
commit that accepts the call freezes its manifest (invariant 19): the batch row (mode, limit, what
to do on a failure, the items and the child tool's frozen binding) and one execution per item,
whose id is derived from the batch's (:func:`child_id`) and whose command is packed then. The
first children go out with that commit; the others wait PENDING (``awaiting_admission``) and are
admitted, as children end, in the transaction that applies their ends (:func:`next_step`). Each
child is an ordinary execution of its route (invariant 6 holds for it as for any call); the batch
call itself is PENDING (``awaiting_batch``) until every child it admitted is settled, and its
result links each child call with its execution, status and result.

A child holds its slot until its outcome is known: an UNKNOWN one holds it until a reconcile
settles it (in ORDERED mode the next call never runs before the one before it is known).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from brain.rules.calls import refusal
from protocol import digest, dumps

NAME = "batch"
ROUTE = "brain"  # as the built-in waits: the Brain answers it, no Hands pool
ORDERED, PARALLEL = "ordered", "parallel"
ALL_SETTLED, FAIL_FAST = "all_settled", "fail_fast"
MAX_ITEMS = 1000
MAX_LIMIT = 64
DEFAULT_LIMIT = 4
INLINE_RESULT_BYTES = 4096  # a child's result larger than this is linked by its execution id

_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "tool": {"type": "string", "minLength": 1, "description": "the tool each item calls"},
        "items": {"type": "array", "items": {"type": "object"}, "minItems": 1, "maxItems": MAX_ITEMS,
                  "description": "the arguments of each call, in order"},
        "mode": {"enum": [ORDERED, PARALLEL], "description": "one at a time in order, or several at once"},
        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT,
                  "description": "calls running at once at most (parallel mode)"},
        "on_failure": {"enum": [ALL_SETTLED, FAIL_FAST],
                       "description": "run every call whatever fails, or start none after a failure"},
    },
    "required": ["tool", "items"],
    "additionalProperties": False,
}  # fmt: skip
_FIELDS = {
    "name": NAME,
    "description": "Call one tool once per item of `items` (each item is that call's arguments): "
    "`ordered` runs them one at a time in order, `parallel` at most `limit` at once; `fail_fast` "
    "starts no more calls after one failed. The result lists each call with its outcome.",
    "input_schema": _SCHEMA,
}
BINDING: dict[str, Any] = {
    **_FIELDS, "version": "builtin", "route": ROUTE, "replay_policy": "safe", "builtin": True,
    "digest": digest(_FIELDS),
}  # fmt: skip
BUILTINS = {NAME: BINDING}

# Where a child stands, for admission (statuses of brain.rules.states.ExecutionStatus).
NOT_ADMITTED = "pending"
IN_FLIGHT = frozenset({"intended", "accepted", "running", "unknown"})
FAILED = frozenset({"failed", "cancelled"})
FINAL = frozenset({"succeeded", "failed", "cancelled"})


@dataclass(frozen=True)
class Manifest:
    """What the commit that accepts a batch freezes: its identity is its execution's."""

    tool: str
    mode: str
    limit: int
    on_failure: str
    items: tuple[Mapping[str, Any], ...]
    binding: Mapping[str, Any]

    @property
    def width(self) -> int:
        """Children in flight at most."""
        return 1 if self.mode == ORDERED else self.limit

    def row(self) -> dict[str, Any]:
        return {"tool": self.tool, "mode": self.mode, "limit": self.limit, "on_failure": self.on_failure,
                "size": len(self.items)}  # fmt: skip


def manifest(args: Mapping[str, Any], bindings: Mapping[str, Any], approvals: Sequence[str] = ()) -> Manifest:
    """The manifest of a batch call whose arguments fit the batch's schema; ValueError saying why
    the Brain refuses it (a tool it cannot batch, an item that does not fit the tool's schema)."""
    tool = args["tool"]
    binding = bindings.get(tool)
    if binding is None:
        tools = ", ".join(sorted(bindings))
        raise ValueError(f"there is no tool named {tool!r} to batch (the tools are: {tools})")
    if binding.get("builtin") or binding.get("manual"):
        raise ValueError(f"{tool} is answered by the Brain or a person: only a Hands tool can be batched")
    if binding.get("requires_approval") or tool in approvals:
        raise ValueError(f"{tool} needs a person's approval for each call: it cannot be batched")
    items = tuple(args["items"])
    for index, item in enumerate(items):
        why = refusal({"tool": tool, "args": item}, bindings)
        if why is not None:
            raise ValueError(f"item {index}: {why}")
    mode = args.get("mode", PARALLEL)
    limit = int(args.get("limit", DEFAULT_LIMIT))
    return Manifest(tool, mode, limit, args.get("on_failure", ALL_SETTLED), items, binding)


def child_id(batch_id: str, index: int) -> str:
    """A child's execution id, derived from its batch's: it ends with the batch's timed id (as
    every execution id does: the Hands tell a command's age by it) after ``b<index>-``."""
    return f"exe-b{index}-{batch_id.removeprefix('exe-')}"


def child_call(call_id: str, index: int) -> str:
    return f"{call_id}#{index}"


def parent_of(execution_id: str) -> tuple[str, int] | None:
    """The batch and index of a child's execution id; None for any other execution."""
    if not execution_id.startswith("exe-b"):
        return None
    index, sep, rest = execution_id[5:].partition("-")
    if not sep or not index.isdigit() or not rest or "-" in rest:
        return None
    return f"exe-{rest}", int(index)


def is_child(execution_id: str) -> bool:
    return parent_of(execution_id) is not None


@dataclass(frozen=True)
class Step:
    """What a batch does next: the children it admits, those it will never run (fail-fast), and
    once nothing is left in flight, how the batch call ends (None: it goes on)."""

    admit: tuple[int, ...] = ()
    skip: tuple[int, ...] = ()
    outcome: str | None = None  # "succeeded" or "failed"


def next_step(mode: str, limit: int, on_failure: str, statuses: Sequence[str]) -> Step:
    """Admission, from the children's statuses by index: the next ones in order while fewer than
    the batch's width are in flight; after a failure in fail-fast mode, none (the rest are
    skipped) and the batch fails once the ones in flight are settled."""
    width = 1 if mode == ORDERED else limit
    waiting = [i for i, s in enumerate(statuses) if s == NOT_ADMITTED]
    in_flight = sum(1 for s in statuses if s in IN_FLIGHT)
    failed = any(s in FAILED for s in statuses)
    if on_failure == FAIL_FAST and failed:
        return Step(skip=tuple(waiting), outcome=None if in_flight else "failed")
    if not waiting and not in_flight:
        return Step(outcome="succeeded")  # every call settled (all-settled: whatever each became)
    return Step(admit=tuple(waiting[: max(0, width - in_flight)]))


def report(
    size: int, mode: str, on_failure: str, children: Sequence[Mapping[str, Any]], stopped: str | None = None
) -> dict[str, Any]:
    """The batch call's result: each child call (by index) with its execution id, status and its
    result (or error), a result too big to repeat linked by the execution id that holds it."""
    calls = []
    counts: dict[str, int] = {}
    for child in sorted(children, key=lambda c: c["index"]):
        status = child["status"]
        counts[status] = counts.get(status, 0) + 1
        one: dict[str, Any] = {"index": child["index"], "call_id": child["call_id"],
                               "execution_id": child["id"], "status": status}  # fmt: skip
        if child.get("how"):
            one["how"] = child["how"]
        if status == "succeeded":
            size_of = len(dumps(child["result"]))
            inline = size_of <= INLINE_RESULT_BYTES
            one |= {"result": child["result"]} if inline else {"result_bytes": size_of}
        elif child.get("error") is not None:
            one["error"] = child["error"]
        calls.append(one)
    summary = {"size": size, "mode": mode, "on_failure": on_failure, "counts": counts, "calls": calls}
    return summary | ({"stopped": stopped} if stopped else {})


def first_failure(children: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The first child (by index) that failed or was cancelled without being skipped."""
    failed = [c for c in children if c["status"] in FAILED and c.get("how") != "not_run"]
    return min(failed, key=lambda c: c["index"]) if failed else None
