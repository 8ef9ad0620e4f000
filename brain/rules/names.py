"""The ids and names a caller gives or looks up: what each may hold and how long it may be.

One rule for the HTTP API and the CLI, checked where input comes in, before anything is stored or
looked up. An id holds no control character (U+0000 to U+001F, U+007F to U+009F: a NUL, which no
store keeps, a newline, an escape) and no lone surrogate (no Unicode at all), and is at most as
long as its kind allows, so that the record's keys always hold it (PostgreSQL refuses an index
entry over 2,704 bytes, and a character takes up to four):

- a session id: at most 200 characters (a submit's path, and every route that names a session);
- a request id: at most 200 (a submit's, a control's, a respond's, a reconcile's);
- an agent's name and its version: at most 200 each (the version 187 on a local development
  server, which adds ``+`` and 12 hex digits of the definition's content);
- a thread name: 1 to 64 letters, digits, ``_``, ``.`` or ``-``, starting with a letter or a digit
  (:func:`check_thread_name`);
- any other id a caller names (a turn's, an execution's, a call's): at most 200.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from protocol import SchemaError

MAX_SESSION_ID = 200
MAX_REQUEST_ID = 200
MAX_AGENT_NAME = 200
MAX_AGENT_VERSION = 200
MAX_THREAD_NAME = 64
MAX_ID = 200

# The control characters (Unicode's category Cc) and the surrogates (Cs), which no id needs.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
SHOWN = 40  # characters of a refused id an error shows


def shown(value: str) -> str:
    """``value`` as an error shows it: quoted with its escapes, cut after ``SHOWN`` characters."""
    return repr(value) if len(value) <= SHOWN else repr(value[:SHOWN]) + "…"


def unprintable(value: str) -> str | None:
    """Why ``value`` holds what no id may (its first control character or surrogate), or None."""
    found = _UNPRINTABLE.search(value)
    if found is None:
        return None
    kind = "a lone surrogate" if "\ud800" <= found.group() <= "\udfff" else "a control character"
    return f"holds {kind} (U+{ord(found.group()):04X}) at character {found.start() + 1}"


def id_problem(value: str, limit: int) -> str | None:
    """Why ``value`` is no id of at most ``limit`` characters (empty, too long, unprintable), or None."""
    if not value:
        return "is empty"
    if len(value) > limit:
        return f"is {len(value):,} characters long: at most {limit}"
    return unprintable(value)


def check_id(what: str, value: str, limit: int) -> None:
    """Raise ``SchemaError`` naming ``what`` when ``value`` is no id of at most ``limit`` characters."""
    problem = id_problem(value, limit)
    if problem is not None:
        raise SchemaError(f"{what} {shown(value)} {problem}")


_THREAD_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_THREAD_NAME - 1}}}")


def check_thread_name(thread: str) -> None:
    """Raise ``SchemaError`` when ``thread`` is no thread name (1 to 64 letters, digits, ``_``,
    ``.`` or ``-``, starting with a letter or a digit: the whole of it, a newline after it too)."""
    if not _THREAD_NAME.fullmatch(thread):
        raise SchemaError(
            f"thread name {shown(thread)} is not valid: 1 to {MAX_THREAD_NAME} letters, digits, '_', '.' "
            "or '-', starting with a letter or digit"
        )


def _printable(value: str) -> str:
    problem = unprintable(value)
    if problem is not None:
        raise PydanticCustomError("unprintable", "{problem}", {"problem": problem})
    return value


def _id(limit: int, description: str) -> object:
    return Field(min_length=1, max_length=limit, description=description)


# The same rules as field types of a request's body (the OpenAPI document says their lengths).
SessionId = Annotated[str, _id(MAX_SESSION_ID, "a session id"), AfterValidator(_printable)]
RequestId = Annotated[str, _id(MAX_REQUEST_ID, "idempotency key"), AfterValidator(_printable)]
AgentName = Annotated[str, _id(MAX_AGENT_NAME, "the agent's name"), AfterValidator(_printable)]
AgentVersion = Annotated[str, _id(MAX_AGENT_VERSION, "the agent's version"), AfterValidator(_printable)]
LookupId = Annotated[str, _id(MAX_ID, "an id Tendon gave"), AfterValidator(_printable)]
