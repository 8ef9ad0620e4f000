"""The contiguous-prefix rule for sequenced execution events (invariant 7), as pure functions."""

from __future__ import annotations

from enum import StrEnum


class Arrival(StrEnum):
    APPLY = "apply"  # the next expected seq: apply now
    DUPLICATE = "duplicate"  # already applied: a no-op
    HOLD = "hold"  # ahead of a gap: keep it (durably) until the gap is filled
    LATE = "late"  # for an execution the Brain settled already (its turn ended): a no-op


def classify(last_applied: int, seq: int, *, settled: bool = False) -> Arrival:
    """What to do with event ``seq`` when events 1..``last_applied`` are applied.

    ``settled``: the execution is final on the Brain's side. Hands say nothing after a final
    event, so a new one is the answer to a cancel the Brain sent when the turn ended first:
    the Hands' ledger keeps what happened; the Brain's record stays as it was settled.
    """
    if seq <= last_applied:
        return Arrival.DUPLICATE
    if settled:
        return Arrival.LATE
    if seq == last_applied + 1:
        return Arrival.APPLY
    return Arrival.HOLD


def drainable(last_applied: int, held: list[int]) -> list[int]:
    """The held seqs that become applicable, in order, once ``last_applied`` is reached."""
    out: list[int] = []
    expected = last_applied + 1
    for seq in sorted(set(held)):
        if seq < expected:
            continue
        if seq != expected:
            break
        out.append(seq)
        expected += 1
    return out


def replay_from(last_applied: int, held: list[int]) -> int | None:
    """The seq to ask Hands to replay from, or None when there is no gap."""
    pending = [s for s in held if s > last_applied]
    if not pending or min(pending) == last_applied + 1:
        return None
    return last_applied + 1
