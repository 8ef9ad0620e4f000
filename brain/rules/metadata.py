"""What a session's or thread's metadata may be: a few string pairs, short enough to list and
search (the sessions list matches their values, and ``key=value``)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from protocol import SchemaError
from protocol.storable import unstorable

MAX_PAIRS = 32
MAX_VALUE = 500
KEY = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def check_metadata(pairs: Mapping[str, object] | None, what: str = "metadata") -> dict[str, str]:
    """``pairs`` as the store keeps them; SchemaError naming the first problem."""
    if not pairs:
        return {}
    if len(pairs) > MAX_PAIRS:
        raise SchemaError(f"{what} takes at most {MAX_PAIRS} keys, not {len(pairs)}")
    checked = {}
    for key, value in pairs.items():
        if not isinstance(key, str) or not KEY.fullmatch(key):
            raise SchemaError(f"{what} key {key!r}: 1 to 64 letters, digits, `_`, `.` or `-`")
        if not isinstance(value, str) or len(value) > MAX_VALUE or unstorable(value) is not None:
            raise SchemaError(f"{what} {key}: a string of at most {MAX_VALUE} characters a store can hold")
        checked[key] = value
    return checked
