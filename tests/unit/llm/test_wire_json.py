"""`wire_json.body_json`: a body's bytes are those the encoder writes for the whole of it, whatever
the body holds; what is `Kept` is encoded once."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stevora.llm.wire_json import ENCODER, Kept, body_json, item_json, list_json

_KEPT = Kept({"role": "user", "content": 'ünïcode \u2028 and "quotes"'})
_BODIES: list[dict[Any, Any]] = [
    {"model": "m", "messages": [_KEPT, {"role": "tool", "content": "x"}, _KEPT], "stream": True},
    {"messages": [], "max_tokens": 5, "extra key": {"nested": [1, 2.5, None, False]}},
    {"model": "m", "messages": "not a list"},
    {"model": "m"},
    {1: "a key that is not text", "messages": [_KEPT]},
    {"messages": [[_KEPT], {"kept inside": _KEPT}]},
]


@pytest.mark.parametrize("body", _BODIES)
def test_the_bytes_are_the_encoders_for_the_whole_body(body: dict[Any, Any]) -> None:
    for _ in range(2):  # encoded, then kept
        assert body_json(body, "messages") == ENCODER.encode(body).encode()
    assert _KEPT.json == ENCODER.encode(_KEPT)


def test_a_kept_items_json_is_made_once_and_a_plain_one_each_time() -> None:
    kept, plain = Kept({"a": 1}), {"a": 1}
    assert item_json(kept) is item_json(kept)  # the same string object: not encoded again
    assert kept.json == '{"a":1}' and item_json(plain) == '{"a":1}'
    assert list_json([kept, plain]) == "[" + '{"a":1},{"a":1}' + "]"
    assert json.loads(list_json([])) == []


def test_what_is_not_json_fails_as_the_encoder_fails() -> None:
    with pytest.raises(ValueError, match="Out of range float"):
        body_json({"messages": [Kept({"x": float("nan")})]}, "messages")
    with pytest.raises(TypeError, match="not JSON serializable"):
        body_json({"messages": [{"x": object()}]}, "messages")
