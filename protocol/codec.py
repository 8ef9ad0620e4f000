"""The one strict JSON codec for everything that crosses a process boundary.

Strict means: duplicate object keys, more than one JSON value in a body, NaN/Infinity,
numbers beyond what a double holds (``1e999``), integers outside the range a double holds
exactly, and decimals that a double cannot represent without rounding are all rejected with a
``DecodeError`` that says where. Encoding is canonical (sorted keys, no spaces, UTF-8) so that
digests are stable, and refuses what decoding would refuse (NaN, Infinity, big integers) with a
``DecodeError`` too, never a bare ``ValueError``.
"""

from __future__ import annotations

import hashlib
import json
import math
from decimal import Decimal, InvalidOperation
from typing import Any

from protocol.errors import DecodeError

MAX_SAFE_INTEGER = 2**53 - 1
# Sixteen digits in a row somewhere in the text (a number's, or a string's): the only texts that
# may hold an integer beyond MAX_SAFE_INTEGER, so the only ones whose values are walked for one.
# Looked for as sixteen "0"s in the text with every digit made a "0" and every other byte an "x":
# a tenth of what a regular expression took (0.4 against 2.8 us for an event), on every encoding.
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= b <= 0x39 else 0x78 for b in range(256))
_SIXTEEN_DIGITS = b"0" * 16


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DecodeError(f"duplicate JSON key {key!r}")
        out[key] = value
    return out


def _parse_int(text: str) -> int:
    value = int(text)
    if abs(value) > MAX_SAFE_INTEGER:
        raise DecodeError(f"integer {text} is outside ±2^53-1 and would lose precision")
    return value


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise DecodeError(f"number {text} is out of range: larger than a double holds")
    try:
        exact = Decimal(text)
    except InvalidOperation as exc:  # pragma: no cover - json already validated the literal
        raise DecodeError(f"bad number {text!r}") from exc
    if Decimal(value) != exact and Decimal(repr(value)) != exact:
        raise DecodeError(f"number {text} cannot be represented without losing precision")
    return value


def _reject_constant(name: str) -> Any:
    raise DecodeError(f"{name} is not valid JSON")


# Made once, as ``_ENCODER`` below: ``json.loads`` with hooks builds a decoder and its scanner for
# every call (12.2 against 10.2 us to decode a message of three events).
_DECODER = json.JSONDecoder(
    object_pairs_hook=_reject_duplicates,
    parse_int=_parse_int,
    parse_float=_parse_float,
    parse_constant=_reject_constant,
)


def loads(data: bytes | str) -> Any:
    """Decode exactly one strict JSON value, or raise ``DecodeError`` saying what is wrong."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"body is not UTF-8: {exc}") from exc
    try:
        return _DECODER.decode(data)
    except DecodeError:
        raise
    except RecursionError as exc:
        raise DecodeError("JSON nested too deeply") from exc
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":
            raise DecodeError(f"more than one JSON value in body (extra data at char {exc.pos})") from exc
        raise DecodeError(f"malformed JSON: {exc.msg} at line {exc.lineno} col {exc.colno}") from exc


def _check_ints(value: Any) -> None:
    if isinstance(value, dict):
        for item in value.values():
            _check_ints(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_ints(item)
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SAFE_INTEGER:
        raise DecodeError(f"integer {value} is outside ±2^53-1; send it as a string")


# Made once: ``json.dumps`` with any argument of its own builds an encoder for every call (4.5
# against 3.7 us to encode an event).
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class Encoded(dict[str, Any]):
    """A JSON object that carries its canonical bytes: encoded once where it is made (a Hands
    event, a command), then stored, sized and sent as those bytes. It reads as the dict it is;
    nothing may change it after it was encoded."""

    __slots__ = ("raw",)

    def __init__(self, value: dict[str, Any]) -> None:
        super().__init__(value)
        self.raw = dumps(value)


def dumps(value: Any) -> bytes:
    """Canonical JSON: sorted keys, compact separators, UTF-8, no NaN.

    Refuses what ``loads`` would refuse (NaN, Infinity, big integers) with a ``DecodeError``,
    so nothing is sent or stored that the receiver must dead-letter. An ``Encoded`` value,
    alone or as an item of a list, is not encoded again.
    """
    if isinstance(value, Encoded):
        return value.raw
    if isinstance(value, list) and any(isinstance(item, Encoded) for item in value):
        # The same bytes as one encoding of the whole list, with each item's own where it has one
        # (only then: a long list of plain values is faster as one encoding).
        return b"[" + b",".join([dumps(item) for item in value]) + b"]"
    try:
        raw = _ENCODER.encode(value).encode("utf-8")
    except ValueError as exc:
        if "Out of range float" not in str(exc):
            raise  # a circular reference: a bug, not a value
        raise DecodeError("NaN and Infinity are not JSON: send such a number as a string") from exc
    if _SIXTEEN_DIGITS in raw.translate(_DIGITS_AS_ZERO):  # an unsafe integer has 16 digits at least
        _check_ints(value)
    return raw


def digest(value: Any) -> str:
    """sha256 (hex) of the canonical JSON of ``value``."""
    return hashlib.sha256(dumps(value)).hexdigest()
