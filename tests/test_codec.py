"""The strict JSON codec: what crosses a process boundary is exactly one lossless JSON value."""

from __future__ import annotations

import hashlib
import json
import math

import pytest

import protocol
from protocol import DecodeError, ProtocolError, codec

MAX_SAFE = 2**53 - 1


def decode_error(data: bytes | str) -> str:
    """Decode ``data`` expecting a DecodeError; return its message (lower-cased) for asserts."""
    with pytest.raises(DecodeError) as info:
        protocol.loads(data)
    return str(info.value).lower()


# ---- what strict JSON still accepts ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '{"a": 1, "b": [true, false, null], "c": "x"}',
            {"a": 1, "b": [True, False, None], "c": "x"},
        ),
        ("[]", []),
        ('"just a string"', "just a string"),
        ("  {}\n", {}),
        ('{"x": {"y": {"z": []}}}', {"x": {"y": {"z": []}}}),
        ('{"same": 1, "other": {"same": 2}}', {"same": 1, "other": {"same": 2}}),
    ],
)
def test_ordinary_json_decodes_to_the_same_python_value(text, expected):
    assert protocol.loads(text) == expected
    assert protocol.loads(text.encode("utf-8")) == expected


def test_utf8_bytes_with_non_ascii_text_decode():
    assert protocol.loads('{"name": "héllo ✓ 日本"}'.encode()) == {"name": "héllo ✓ 日本"}


# ---- duplicate keys ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1, "a": 2}',
        '{"a": 1, "a": 1}',
        '{"outer": {"k": 1, "k": 2}}',
        '[{"ok": 1}, {"k": 1, "k": 2}]',
        '{"a": {"b": [{"c": {"k": true, "k": false}}]}}',
    ],
)
def test_duplicate_keys_are_rejected_at_any_depth(text):
    message = decode_error(text)
    assert "duplicate" in message
    assert "'k'" in message or "'a'" in message


def test_the_duplicate_key_message_names_the_key():
    assert "'amount'" in decode_error('{"amount": 1, "amount": 1000}')


# ---- exactly one value -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ['{"a": 1} {"a": 2}', '{"a": 1}\n{"a": 1}', "1 2", "[] []", '"x" "y"', '{"a": 1}}'],
)
def test_more_than_one_json_value_in_a_body_is_rejected(text):
    message = decode_error(text)
    assert "more than one json value" in message


@pytest.mark.parametrize("text", ["", "   ", "{", '{"a": }', "{'a': 1}", "[1,]", "tru"])
def test_malformed_json_is_a_decode_error_that_says_malformed(text):
    message = decode_error(text)
    assert "malformed json" in message
    assert "line" in message and "col" in message


# ---- NaN / Infinity ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "word"),
    [
        ("NaN", "nan"),
        ("Infinity", "infinity"),
        ("-Infinity", "-infinity"),
        ('{"x": NaN}', "nan"),
        ('{"x": [1, Infinity]}', "infinity"),
    ],
)
def test_nan_and_infinity_are_rejected(text, word):
    message = decode_error(text)
    assert word in message
    assert "not valid json" in message


def test_numbers_too_large_for_a_double_are_rejected_instead_of_becoming_infinity():
    for text in ("1e400", "-1e999", '{"x": 1.7976931348623159e308}'):
        assert "out of range: larger than a double holds" in decode_error(text)


# ---- integers ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -0, 1, -1, MAX_SAFE, -MAX_SAFE, 2**31, 10**15])
def test_integers_a_double_holds_exactly_are_accepted(value):
    decoded = protocol.loads(str(value))
    assert decoded == value
    assert isinstance(decoded, int)


@pytest.mark.parametrize("value", [MAX_SAFE + 1, -(MAX_SAFE + 1), 2**63, 10**30])
def test_integers_beyond_two_to_the_53_minus_one_are_rejected(value):
    message = decode_error(f'{{"n": {value}}}')
    assert "integer" in message
    assert str(value) in message
    assert "precision" in message


@pytest.mark.parametrize(
    "value",
    [
        {"n": MAX_SAFE + 1},
        [1, [2, {"deep": [-(MAX_SAFE + 1)]}]],
        {"digits": "12345678901234567890", "n": 10**17},  # digits in a string and a big number
        {"f": 0.12345678901234567, "n": [2**64]},
    ],
)
def test_what_is_encoded_holds_no_integer_beyond_two_to_the_53_minus_one_wherever_it_is(value):
    with pytest.raises(protocol.DecodeError, match="outside"):
        protocol.dumps(value)


@pytest.mark.parametrize(
    "value",
    [
        {"n": MAX_SAFE, "m": -MAX_SAFE},  # sixteen digits: looked at, and fine
        {"digits": "12345678901234567890", "f": 0.12345678901234567, "n": 10**15},
    ],
)
def test_sixteen_digits_that_are_no_unsafe_integer_are_encoded(value):
    assert protocol.loads(protocol.dumps(value)) == value


# ---- decimals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "0.1",
        "1.5e10",
        "-2.5",
        "1e-7",
        "1E2",
        "3.14159",
        "0.30000000000000004",
        "1.0",
        "-0.0",
        "5e-324",
        "1e16",
        "123.456e-2",
    ],
)
def test_ordinary_decimals_are_accepted_as_the_nearest_double(text):
    decoded = protocol.loads(text)
    assert isinstance(decoded, float)
    assert decoded == float(text)


@pytest.mark.parametrize(
    "text",
    [
        "0.1000000000000000000000001",
        "1.00000000000000000001",
        "9007199254740993.0",
        "123456789012345678901234567890e-10",
        "1e-400",
    ],
)
def test_decimals_that_cannot_round_trip_as_a_double_are_rejected(text):
    message = decode_error(f'{{"amount": {text}}}')
    assert text.lower() in message
    assert "precision" in message


def test_every_double_repr_survives_a_round_trip():
    for value in (0.1, 1 / 3, math.pi, 1e-300, 2.5e300, -123.456, float(MAX_SAFE)):
        assert protocol.loads(protocol.dumps({"v": value})) == {"v": value}


# ---- encoding ----------------------------------------------------------------------------


def test_non_utf8_bytes_are_rejected_with_a_message_about_utf8():
    for raw in (b'{"a": "\xff"}', b"\xc3\x28", b'"\xed\xa0\x80"', '{"a": "é"}'.encode("latin-1")):
        message = decode_error(raw)
        assert "utf-8" in message


# ---- the error itself --------------------------------------------------------------------


def test_decode_errors_are_permanent_protocol_errors_with_a_stable_code():
    with pytest.raises(DecodeError) as info:
        protocol.loads('{"a": 1, "a": 2}')
    err = info.value
    assert isinstance(err, ProtocolError)
    assert err.retryable is False
    assert protocol.is_retryable(err) is False
    assert err.as_dict() == {"code": "decode_error", "message": err.message}
    assert err.message == str(err)


# ---- canonical dumps and digest ----------------------------------------------------------


def test_dumps_is_canonical_sorted_compact_utf8():
    value = {"b": [1, 2.5, None, True], "a": {"z": "é", "y": "x"}}
    assert protocol.dumps(value) == '{"a":{"y":"x","z":"é"},"b":[1,2.5,null,true]}'.encode()


def test_dumps_does_not_depend_on_key_insertion_order():
    one = {"a": 1, "b": {"c": 2, "d": [3, {"e": 4, "f": 5}]}}
    two = {"b": {"d": [3, {"f": 5, "e": 4}], "c": 2}, "a": 1}
    assert protocol.dumps(one) == protocol.dumps(two)


def test_dumps_then_loads_gives_back_the_value():
    value = {"text": 'line\nbreak "quoted" ✓', "n": -MAX_SAFE, "f": 0.1, "l": [None, False]}
    assert protocol.loads(protocol.dumps(value)) == value


def canonical(value: object) -> bytes:
    """One encoding of the whole value, as ``dumps`` made it before values carried their bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def test_an_encoded_value_is_encoded_once_and_sent_as_the_bytes_it_carries():
    value = codec.Encoded({"b": "é ✓", "a": [1, {"y": None, "x": 0.5}]})
    assert value == {"a": [1, {"x": 0.5, "y": None}], "b": "é ✓"}  # reads as the dict it is
    assert value.raw == canonical(dict(value))
    assert protocol.dumps(value) is value.raw  # not encoded again
    # Nor as an item of a list that holds it (and of such a list inside it): what it carries goes out.
    value.raw = b'{"carried":true}'
    assert protocol.dumps([1, value, [value]]) == b'[1,{"carried":true},[{"carried":true}]]'


@pytest.mark.parametrize(
    "items",
    [[], [None], ["é", 1, 2.5, True], [{"b": 1, "a": [2, {"d": 3, "c": 4}]}, [], [[{"z": "x"}]]]],
)
def test_a_list_is_encoded_item_by_item_to_the_same_bytes_as_one_encoding(items):
    assert protocol.dumps(items) == canonical(items)
    mixed = [codec.Encoded(i) if isinstance(i, dict) else i for i in items]
    assert protocol.dumps(mixed) == canonical(items)


def test_a_list_refuses_what_one_encoding_refuses():
    with pytest.raises(DecodeError):
        protocol.dumps([1, {"n": MAX_SAFE + 1}])
    with pytest.raises(DecodeError):
        codec.Encoded({"n": [MAX_SAFE + 1]})
    with pytest.raises(DecodeError):
        protocol.dumps([[math.nan]])


def test_dumps_refuses_nan_and_infinity_as_the_codec_error_not_a_bare_value_error():
    # A NaN that reached an encoding (a manual tool's result a client sent) is bad input to say
    # so, not a crash: the HTTP API answers it with a 422
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(DecodeError, match="NaN and Infinity are not JSON"):
            protocol.dumps({"x": bad})
    # while what is a bug stays one
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference") as info:
        protocol.dumps(loop)
    assert not isinstance(info.value, DecodeError)


def test_digest_is_the_sha256_of_the_canonical_bytes_and_is_pinned():
    value = {"b": [1, 2.5, None, True], "a": {"z": "é", "y": "x"}}
    assert protocol.digest(value) == hashlib.sha256(protocol.dumps(value)).hexdigest()
    # Pinned: a change here silently invalidates every stored request and binding digest.
    assert protocol.digest(value) == ("a65589f336d078d14e9bcf0fe260bd0f28aece65b004aeb70c116e4cae0035bd")


def test_digest_is_stable_across_key_order_and_changes_with_any_value():
    base = {"a": 1, "b": [1, 2], "c": {"d": "x"}}
    assert protocol.digest(base) == protocol.digest({"c": {"d": "x"}, "b": [1, 2], "a": 1})
    variants = [
        {"a": 2, "b": [1, 2], "c": {"d": "x"}},
        {"a": 1, "b": [2, 1], "c": {"d": "x"}},
        {"a": 1, "b": [1, 2], "c": {"d": "y"}},
        {"a": 1, "b": [1, 2], "c": {"d": "x"}, "e": None},
        {"a": 1.5, "b": [1, 2], "c": {"d": "x"}},
    ]
    digests = {protocol.digest(v) for v in variants}
    assert len(digests) == len(variants)
    assert protocol.digest(base) not in digests


# ---- hardening: inputs that once slipped through ------------------------------------------


def test_absurdly_deep_nesting_is_a_decode_error_not_a_crash():
    with pytest.raises(DecodeError):
        codec.loads("[" * 100_000 + "]" * 100_000)
