"""What JSON a run can store and read back exactly (stevora.storable; docs/security.md)."""

from __future__ import annotations

import json

import orjson
import pytest

from stevora.api.limits import body_problem
from stevora.settings import Settings
from stevora.storable import (
    INVALID_NUMBER,
    INVALID_UNICODE,
    JSON_TOO_DEEP,
    MAX_INT,
    MIN_INT,
    encoded_size,
    problem_in_dumped,
    problem_in_value,
)

DEPTH = Settings.model_fields["max_json_depth"].default


def test_the_default_depth_leaves_room_under_the_serializers_own_limits() -> None:
    # orjson and pydantic stop at 255; events, webhooks and envelopes wrap a value a few levels.
    assert DEPTH == 64
    with pytest.raises(ValueError, match="max_json_depth"):
        Settings(max_json_depth=201)


@pytest.mark.parametrize(
    ("body", "code", "path"),
    [
        (b'{"input": {"n": ' + b"1" * 400 + b"}}", INVALID_NUMBER, "input.n"),
        (b'{"input": {"n": 9223372036854775808}}', INVALID_NUMBER, "input.n"),
        (b'{"input": {"n": -9223372036854775809}}', INVALID_NUMBER, "input.n"),
        (b'{"a": [NaN]}', INVALID_NUMBER, "a[0]"),
        (b'{"a": {"b c": Infinity}}', INVALID_NUMBER, 'a["b c"]'),
        (b'{"a": -Infinity}', INVALID_NUMBER, "a"),
        (b'{"a": 1e309}', INVALID_NUMBER, "a"),
        (b'{"s": "\\ud800"}', INVALID_UNICODE, "s"),
        (b'{"\\udc00": 1}', INVALID_UNICODE, "body"),
        (b'{"s": "\xed\xa0\x80"}', INVALID_UNICODE, "body"),  # CESU: a surrogate encoded as UTF-8
        ('{"n": NaN}'.encode("utf-16"), INVALID_UNICODE, "body"),
        (b'{"input": {"s": "a\\u0000b"}}', "VALIDATION_ERROR", "input.s"),
        (b"\xef\xbb\xbf{}", "VALIDATION_ERROR", "body"),  # a BOM: the route's parser would skip it
        (b"not json at all [[[[", "VALIDATION_ERROR", "body"),
        (b'{"x": ' + b"[" * 65 + b"]" * 65 + b"}", JSON_TOO_DEEP, "x" + "[0]" * 63),
        (b'{"first": 1, "x": ' + b"[" * 5000 + b"]" * 5000 + b"}", JSON_TOO_DEEP, "x"),
    ],
)
def test_bodies_that_cannot_round_trip_name_their_field(body: bytes, code: str, path: str) -> None:
    problem = body_problem(body, DEPTH)
    assert problem is not None and (problem.code, problem.path) == (code, path)


@pytest.mark.parametrize(
    "body",
    [
        b'{"n": 9223372036854775807, "m": -9223372036854775808, "f": 1.5e300}',
        b'{"s": "\\ud83d\\ude00 1234567890123456789012 NaN Infinity"}',
        b'{"x": ' + b"[" * 63 + b"]" * 63 + b"}",
    ],
)
def test_storable_bodies_pass(body: bytes) -> None:
    assert body_problem(body, DEPTH) is None


def test_values_are_checked_the_same_way_with_the_field_as_root() -> None:
    assert problem_in_value({"a": [1, {"b": MAX_INT + 1}]}, max_depth=DEPTH, root="input") is not None
    found = problem_in_value({"a": [1, {"b": MAX_INT + 1}]}, max_depth=DEPTH, root="input")
    assert found is not None and found.path == "input.a[1].b"
    nan = problem_in_value({"x": float("nan")}, max_depth=DEPTH, root="payload")
    assert nan is not None and (nan.code, nan.path) == (INVALID_NUMBER, "payload.x")
    assert problem_in_value({"a": MIN_INT, "b": True, "c": None, "d": 0.5}, max_depth=DEPTH) is None


def test_the_first_problem_in_document_order_is_reported() -> None:
    found = problem_in_value({"a": float("inf"), "b": "\ud800"}, max_depth=DEPTH)
    assert found is not None and found.path == "a"


def test_dumped_values_skip_the_walk_unless_the_text_looks_suspect() -> None:
    fine = {"a": [1, 2, "x"]}
    assert problem_in_dumped(fine, json.dumps(fine), max_depth=DEPTH) is None
    big = {"a": 2**70}
    assert problem_in_dumped(big, json.dumps(big), max_depth=DEPTH, root="output") is not None


def test_encoded_size_is_the_stored_json_text_in_utf8_bytes() -> None:
    value = {"é": "ü" * 3, "n": [1, 2]}
    assert encoded_size(value) == len(orjson.dumps(value))
    assert encoded_size({"big": 2**70}) == len(b'{"big":1180591620717411303424}')


def test_wide_shallow_bodies_and_brackets_inside_strings_are_not_taken_for_depth() -> None:
    wide = json.dumps({"items": [{"id": i, "tags": ["a", "[[[{{{"]} for i in range(2000)]}).encode()
    assert body_problem(wide, DEPTH) is None
    brackets_in_a_string = json.dumps({"s": "[" * 500 + "{" * 500}).encode()
    assert body_problem(brackets_in_a_string, DEPTH) is None
    assert problem_in_value(json.loads(wide), max_depth=DEPTH) is None


def test_an_escaped_quote_before_a_bracket_does_not_hide_depth() -> None:
    body = b'{"s": "a\\"[", "x": ' + b"[" * 70 + b"]" * 70 + b"}"
    found = body_problem(body, DEPTH)
    assert found is not None and found.code == JSON_TOO_DEEP and found.path.startswith("x[0]")
