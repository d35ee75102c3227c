"""Dagu's `defaultParams` strings become JSON Schemas (examples from docs/definitions.md, "The run input")."""

from __future__ import annotations

import pytest

from stevora.definitions import ParamsError, parse_default_params, parse_definition
from stevora.errors import ValidationError


def test_the_documented_example_infers_types_and_defaults() -> None:
    assert parse_default_params("query max_results=10 include_images=false temperature=0.7") == {
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "max_results": {"type": "integer", "default": 10},
            "include_images": {"type": "boolean", "default": False},
            "temperature": {"type": "number", "default": 0.7},
        },
        "required": ["query"],
    }


@pytest.mark.parametrize(
    ("text", "required"),
    [("operation a b", ["operation", "a", "b"]), ("input", ["input"]), ("query", ["query"])],
)
def test_bare_names_are_required_strings(text: str, required: list[str]) -> None:
    schema = parse_default_params(text)
    assert schema["required"] == required
    assert all(schema["properties"][name] == {"type": "string"} for name in required)


def test_quoted_values_are_strings_and_brackets_are_arrays_and_objects() -> None:
    schema = parse_default_params('name="default value" limit="10" filters=[] config={} tags=["a","b"]')
    assert schema["properties"] == {
        "name": {"type": "string", "default": "default value"},
        "limit": {"type": "string", "default": "10"},
        "filters": {"type": "array", "default": []},
        "config": {"type": "object", "default": {}},
        "tags": {"type": "array", "default": ["a", "b"]},
    }
    assert "required" not in schema


@pytest.mark.parametrize(
    ("text", "fragment"), [("a a", "twice"), ("a=1 ?x", "?x"), ("cfg={oops", "JSON object")]
)
def test_unreadable_params_name_the_problem(text: str, fragment: str) -> None:
    with pytest.raises(ParamsError, match=fragment.replace("?", r"\?")):
        parse_default_params(text)


def test_a_definition_with_bad_default_params_is_a_validation_error_naming_the_field() -> None:
    with pytest.raises(ValidationError) as caught:
        parse_definition(
            {
                "name": "x",
                "version": "1",
                "defaultParams": "q q",
                "steps": [{"type": "wait", "name": "w", "durationMs": 1}],
            }
        )
    assert caught.value.details["errors"][0]["path"] == "defaultParams"
