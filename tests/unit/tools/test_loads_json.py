"""`loads_json`: `json.loads` by orjson where orjson reads the text the same way. orjson reads an
integer beyond 64 bits as a float, so a text with a run of 19 digits (`has_long_digits`) is read
by the stdlib; so is what orjson refuses (NaN, Infinity, numbers beyond a double)."""

from __future__ import annotations

import json
import math
import re

import pytest

from stevora.tools.invoke import has_long_digits, loads_json

_TEXTS = [
    "",
    "1234567890123456789",  # 19 digits
    "123456789012345678",  # 18
    '{"a": 123456789012345678, "b": 9}',  # 18, then one more digit elsewhere
    '{"a": "x1234567890123456789y"}',
    "12345678901234567\u00e9890",  # split by a non-ASCII letter
    "\u0661" * 25,  # Arabic-Indic digits: not [0-9]
    "\U0001f600" + "9" * 19 + "\ud800",  # an emoji and a lone surrogate around the run
    "99999999999999999 99",
]


@pytest.mark.parametrize("text", _TEXTS)
def test_a_run_of_19_digits_is_found_as_the_regex_finds_it(text: str) -> None:
    assert has_long_digits(text) == (re.search("[0-9]{19}", text) is not None)


@pytest.mark.parametrize(
    "text",
    [
        "18446744073709551616",  # 2**64: orjson would give 1.8446744073709552e+19
        '{"id": -9223372036854775809, "n": [123456789012345678901234]}',
        '{"usage": {"input_tokens": 1200}, "text": "h\\u00e9llo"}',
    ],
)
def test_integers_beyond_64_bits_are_read_exactly(text: str) -> None:
    assert loads_json(text) == json.loads(text)
    assert repr(loads_json(text)) == repr(json.loads(text))  # ints stay ints


def test_what_orjson_refuses_is_read_by_the_stdlib() -> None:
    assert math.isnan(loads_json("NaN")) and loads_json("[Infinity]") == [math.inf]


@pytest.mark.parametrize(
    "data",
    [
        b'{"id": "msg_1", "n": 18446744073709551616, "t": "h\xc3\xa9llo"}',
        b'\xef\xbb\xbf{"bom": 1}',  # the stdlib reads UTF-8 with a byte-order mark
        '{"utf16": 1}'.encode("utf-16"),
        b'{"ok": 1, "lone": "\\ud800"}',
        b"\xff{}",  # not UTF-8: the stdlib's own error
        b"[NaN]",
    ],
)
def test_bytes_are_read_as_the_stdlib_reads_them(data: bytes) -> None:
    """An answer's body as it arrives: what `json.loads(data)` gives, or its error."""
    assert has_long_digits(data) == (re.search(b"[0-9]{19}", data) is not None)
    try:
        expected: object = json.loads(data)
    except ValueError as exc:
        with pytest.raises(type(exc)):
            loads_json(data)
        return
    assert repr(loads_json(data)) == repr(expected)
