"""The rules of the LangGraph-compatible API that are Tendon's own decisions (``brain.api.langgraph``
maps the wire): what status a run shows, what a ``command.resume`` answers, and a run's webhook.

A run is a turn, or the same turn resumed by an answer to its interrupt. A run stops where its
turn ends, or where a call of it waits for a person (an interrupt): LangGraph's run is then done
(``success``), and its thread ``interrupted`` until a resume answers.

=================================  =========
the run's turn                     status
=================================  =========
a later run of it exists           success (it stopped at an interrupt that run answered)
completed                          success
failed                             error
cancelled                          interrupted
a call of it waits for a person    success (stopped at an interrupt)
queued (or a delayed run unfired)  pending
anything else                      running
=================================  =========
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from protocol import IllegalTransitionError, SchemaError

_ENDED = {"completed": "success", "failed": "error", "cancelled": "interrupted"}
APPROVE = (True, "approve", "approved", "accept", "yes")
DENY = (False, "deny", "denied", "reject", "no")


def run_status(turn_status: str | None, *, waits_for_person: bool, resumed_later: bool) -> str:
    """A run's LangGraph status (the table above); ``turn_status`` None: not submitted yet."""
    if resumed_later:
        return "success"
    if turn_status in _ENDED:
        return _ENDED[turn_status]
    if waits_for_person:
        return "success"
    return "pending" if turn_status in (None, "queued") else "running"


@dataclass(frozen=True)
class Answer:
    """A person's answer to one call, as ``/v1/turns/{id}/respond`` takes it."""

    call: str
    decision: str  # approve, deny or result
    result: Any = None
    reason: str | None = None


def answers(resume: Any, waiting: Sequence[Mapping[str, Any]]) -> list[Answer]:
    """The answers a ``command.resume`` gives to the interrupts that wait (each ``id``, and
    ``value.awaits``: ``approval`` or ``result``). With one interrupt, the resume is its answer;
    with several, it maps interrupt ids to answers (those not named wait on)."""
    if not waiting:
        raise IllegalTransitionError("the thread has no interrupt to resume: nothing waits for a person")
    by_id = {str(w["id"]): w for w in waiting}
    if isinstance(resume, dict) and resume and set(resume) <= set(by_id):
        return [_answer(by_id[k], v) for k, v in resume.items()]
    if len(waiting) > 1:
        raise SchemaError(
            f"{len(waiting)} interrupts wait ({', '.join(sorted(by_id))}): resume with "
            "{interrupt id: answer}"
        )
    return [_answer(waiting[0], resume)]


def _answer(interrupt: Mapping[str, Any], value: Any) -> Answer:
    call = str(interrupt["id"])
    if (interrupt.get("value") or {}).get("awaits") == "result":
        said = value["result"] if isinstance(value, dict) and set(value) == {"result"} else value
        return Answer(call, "result", result=said)
    decision, reason = value, None
    if isinstance(value, dict):
        decision = value.get("decision", value.get("type", value.get("action")))
        reason = value.get("reason", value.get("message"))
    if isinstance(decision, str):
        decision = decision.lower()
    if decision in APPROVE:
        return Answer(call, "approve")
    if decision in DENY:
        return Answer(call, "deny", reason=str(reason) if reason is not None else None)
    raise SchemaError(
        f'interrupt {call} waits for an approval: resume with true or "approve", false or "deny", or '
        '{"decision": "deny", "reason": "..."}'
    )


# A run's webhook (``brain.run.webhooks``): tried once its turn ended or stopped at an interrupt,
# again after a failure (not a 2xx, or no answer) after a delay doubling from the Brain's scan
# interval up to ``WEBHOOK_MAX_DELAY``, and given up after ``WEBHOOK_ATTEMPTS`` tries (invariant
# 15), which its turn's journal then says (``turn.webhook_failed``).
WEBHOOK_ATTEMPTS = 6
WEBHOOK_MAX_DELAY = 300.0
MAX_WEBHOOK_URL = 2000


def webhook_url(url: Any, *, private: bool = False) -> str:
    """A run's ``webhook``, checked: an http or https URL with a host, which names no loopback,
    private or link-local address (nor ``localhost``) unless ``private`` (``TENDON_WEBHOOK_PRIVATE``).
    A host name is not resolved here: a name of the outside world that points inside is the
    network's to refuse."""
    if not isinstance(url, str) or not url or len(url) > MAX_WEBHOOK_URL:
        raise SchemaError(f"webhook is an http(s) URL of at most {MAX_WEBHOOK_URL} characters")
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - a port that is no number raises here
    except ValueError as exc:
        raise SchemaError(f"webhook is not a URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not host:
        raise SchemaError(f"webhook must be an http or https URL with a host, not {url[:60]!r}")
    if not private and _inside(host):
        raise SchemaError(
            f"webhook {host[:60]!r} is a loopback, private or link-local address: refused unless "
            "TENDON_WEBHOOK_PRIVATE=true"
        )
    return url


def _inside(host: str) -> bool:
    if host.rstrip(".").lower() == "localhost" or host.lower().endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_unspecified or ip.is_reserved


def webhook_delay(attempts: int, base: float) -> float:
    """Seconds before the next try, after ``attempts`` failed ones."""
    return float(min(WEBHOOK_MAX_DELAY, base * 2 ** max(0, attempts - 1)))


def webhook_payload(row: Mapping[str, Any], thread_id: str) -> dict[str, Any]:
    """What a webhook POSTs: the run as LangGraph's clients read it, once it finished."""
    body = row["body"] or {}
    status = run_status(row["turn_status"], waits_for_person=bool(row["pending"]), resumed_later=False)
    return {"run_id": row["run_id"], "thread_id": thread_id, "assistant_id": body.get("assistant_id"),
            "status": status, "metadata": body.get("metadata") or {},
            "multitask_strategy": body.get("multitask_strategy")}  # fmt: skip
