"""What every store accepts as text and JSON: PostgreSQL refuses NUL characters and lone
surrogates in text and jsonb, and SQLite keeps the same rule, so that both stores refuse the same
input (and a saved error never fails for the very reason it reports)."""

from __future__ import annotations

from typing import Any


def unstorable(value: Any) -> str | None:
    """Why PostgreSQL cannot store ``value`` as text or jsonb (a NUL character, or a lone
    surrogate that is no Unicode at all), or None when it can. SQLite keeps the same rule, so
    that both stores refuse the same input."""
    if isinstance(value, str):
        if "\x00" in value:
            return "contains a NUL character (\\u0000)"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "contains a lone surrogate, which is not valid Unicode"
        return None
    if isinstance(value, dict):
        items: list[Any] = [*value.keys(), *value.values()]
        return next((p for p in map(unstorable, items) if p), None)
    if isinstance(value, list | tuple):
        return next((p for p in map(unstorable, value) if p), None)
    return None


def storable(text: str, limit: int = 2000) -> str:
    """``text`` as PostgreSQL text and jsonb accept it (they refuse NUL characters and lone
    surrogates), at most ``limit`` characters: a saved error must never fail for the very
    reason it reports."""
    safe = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return safe if len(safe) <= limit else safe[:limit] + "…"


def describe(exc: BaseException) -> str:
    """``Type: message`` of an error, storable (what a row or a fact says went wrong)."""
    text = str(exc)
    return storable(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)
