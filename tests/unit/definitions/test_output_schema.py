"""The provider's strict form of a step's outputSchema: what is fixed up and what is refused."""

from __future__ import annotations

from typing import Any

import pytest

from stevora.definitions.output_schema import full_schema, native_problems, native_schema

NESTED: dict[str, Any] = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"n": {"type": "integer", "minimum": 1}},
                "required": ["n"],
            },
            "maxItems": 5,
        },
        "name": {"type": "string", "maxLength": 10, "default": "x", "description": "Who"},
        "kind": {"oneOf": [{"const": "a"}, {"const": "b"}]},
    },
    "required": ["items", "name", "kind"],
}


def test_every_object_is_closed_and_unsupported_keywords_move_into_the_description() -> None:
    openai, problem = native_schema(NESTED, "openai")
    assert problem is None and openai is not None
    assert openai["additionalProperties"] is False
    item = openai["properties"]["items"]["items"]
    assert item["additionalProperties"] is False and item["properties"]["n"]["minimum"] == 1
    name = openai["properties"]["name"]
    assert name == {"type": "string", "description": "Who\n\n{maxLength: 10}"}  # default dropped
    assert "anyOf" in openai["properties"]["kind"] and "oneOf" not in openai["properties"]["kind"]


def test_anthropic_loses_numeric_and_length_bounds_to_the_description() -> None:
    schema, problem = native_schema(NESTED, "anthropic")
    assert problem is None and schema is not None
    n = schema["properties"]["items"]["items"]["properties"]["n"]
    assert "minimum" not in n and "minimum: 1" in n["description"]
    assert "maxItems" not in schema["properties"]["items"]


def test_an_optional_property_is_refused_by_openai_strict_mode_only() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
        "required": ["a"],
    }
    _, problem = native_schema(schema, "openai")
    assert problem is not None and problem.path == ("properties", "b")
    assert native_schema(schema, "anthropic")[1] is None


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        ({"type": "object", "additionalProperties": True}, ("additionalProperties",)),
        ({"type": "object", "patternProperties": {"^x": {}}}, ("patternProperties",)),
        (
            {
                "type": "object",
                "properties": {"m": {"type": "object", "additionalProperties": {"type": "number"}}},
                "required": ["m"],
            },
            ("properties", "m", "additionalProperties"),
        ),
        ({"type": ["object"], "properties": {}, "additionalProperties": {}}, ("additionalProperties",)),
    ],
)
def test_an_open_object_cannot_be_fixed_and_is_named(schema: dict[str, Any], path: tuple[str, ...]) -> None:
    assert [p.path for p in native_problems(schema)] == [path]


def test_the_flat_field_map_is_a_closed_object_with_every_field_required() -> None:
    flat = {"score": {"type": "number"}, "summary": {"type": "string"}}
    assert full_schema(flat) == {"type": "object", "properties": flat, "required": ["score", "summary"]}
    schema, problem = native_schema(flat, "openai")
    assert problem is None and schema is not None and schema["additionalProperties"] is False
