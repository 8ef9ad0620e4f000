"""Assistant messages as a person watching a thread sees them: a logical id per model call, and
the attempts that made (or failed to make) it.

A turn's model calls are numbered (the turn's ``model_calls`` once the reply commits), and the
message a call makes is ``<turn id>/m<number>``: the same id for every attempt of that call, in
any run and any Brain, since the number only moves when a reply commits. An attempt that ends
without a reply (its run lost mid-call, or the call failed and is retried) is journaled as
``message.superseded`` in the commit that records that end, and the turn's ``model_attempt``
counts it; the next attempt is one more, and its previews carry its number. The committed reply
(``turn.model_replied``) carries both: it is the message's completed, durable form.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from brain.rules import facts
from brain.rules.records import Entry


def message_id(turn_id: str, number: int) -> str:
    """The logical id of the message the ``number``-th model call of ``turn_id`` makes."""
    return f"{turn_id}/m{number}"


def next_message(turn_id: str, model_calls: int, model_attempt: int) -> tuple[str, int]:
    """The id and attempt of the model call a turn makes next (``model_calls`` replies committed,
    ``model_attempt`` attempts of the next one ended without a reply)."""
    return message_id(turn_id, model_calls + 1), model_attempt + 1


def superseded_by_loss(turn_id: str, model_calls: int, attempts: int, *, died: bool) -> facts.Fact:
    """The fact of a run lost while its turn was at a model call: ``attempts`` counts that call's
    attempts that ended without a reply, the lost one included (the turn's row after the loss)."""
    how = "its Brain died" if died else "its Brain stopped"
    return facts.superseded(message_id(turn_id, model_calls + 1), attempts, f"the run was lost ({how})")


def messages(entries: Iterable[Entry]) -> dict[str, list[dict[str, Any]]]:
    """Each turn's assistant messages, by turn id, in order: ``id``, ``attempt`` (the one that
    replied; None while no attempt has), ``superseded`` (the attempts that ended without a reply),
    ``text`` and ``tool_calls``."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for entry in entries:
        for fact in entry.facts:
            kind, mid = fact.get("kind"), fact.get("message_id")
            if kind not in ("turn.model_replied", "message.superseded") or not mid or not entry.turn_id:
                continue
            message = found.setdefault(entry.turn_id, {}).setdefault(mid, _blank(mid))
            if kind == "message.superseded":
                message["superseded"].append(fact.get("attempt"))
            else:
                _completed(message, fact)
    return {turn: list(by_id.values()) for turn, by_id in found.items()}


def _blank(mid: str) -> dict[str, Any]:
    return {"id": mid, "attempt": None, "superseded": [], "text": None, "tool_calls": []}


def _completed(message: dict[str, Any], fact: Mapping[str, Any]) -> None:
    said = fact.get("message") or {}
    message["attempt"] = fact.get("attempt", 1)
    message["text"] = said.get("text")
    message["tool_calls"] = said.get("tool_calls") or []
