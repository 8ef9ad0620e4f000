"""Values bound for JSON columns, as both backends encode them (through the one codec)."""

from __future__ import annotations

from typing import Any

from protocol import codec


class Json:
    """A value bound for a JSON column that may be a bare string or number.

    PostgreSQL knows a parameter's column type; SQLite does not, and would store a bare
    string as text that no longer reads back as JSON. Wrapping says "encode me as JSON".
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def as_json(value: Any) -> Any:
    """``value`` bound as JSON (None stays NULL): also what an element of a jsonb[] parameter must
    be, where a list would read as one more array dimension."""
    return value if value is None or isinstance(value, Json) else Json(value)


def encode_json(value: Any) -> str:
    return codec.dumps(value.value if isinstance(value, Json) else value).decode("utf-8")
