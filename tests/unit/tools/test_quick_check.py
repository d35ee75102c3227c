"""The quick check's promise: it says "valid" only where jsonschema finds no error, and it does
answer for the schemas tools use (else it would save nothing)."""

from __future__ import annotations

import random
from typing import Any, Literal

import pydantic
import pytest
from jsonschema import Draft4Validator, Draft7Validator, Draft202012Validator

from stevora.tools.quick_check import quick_check
from stevora.tools.schema import compiled_schema, schema_from_function

_NAMES = ["a", "b", "c"]
_TYPE_NAMES = ["string", "integer", "number", "boolean", "null", "array", "object"]
_COUNTS = ("minLength", "maxLength", "minProperties", "maxProperties", "minItems", "maxItems")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


class _Gen:
    """Random schemas inside the quick check's part and random values (seeded: reproducible)."""

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)

    def scalar(self) -> Any:
        r = self.r
        return r.choice(
            [
                None,
                True,
                False,
                r.randint(-5, 5),
                r.choice([0.0, 1.0, -2.5, 3.5, 1e300]),
                r.choice(["", "x", "ab", "abc"]),
            ]
        )

    def value(self, depth: int = 3) -> Any:
        k = self.r.random()
        if depth <= 0 or k < 0.5:
            return self.scalar()
        if k < 0.7:
            return [self.value(depth - 1) for _ in range(self.r.randint(0, 3))]
        if k < 0.95:
            return {self.r.choice([*_NAMES, "z"]): self.value(depth - 1) for _ in range(self.r.randint(0, 3))}
        return (self.value(depth - 1),)  # not a JSON type: never "certainly valid"

    def schema(self, depth: int = 2) -> Any:
        r = self.r
        if depth < 2 and r.random() < 0.15:
            return r.choice([True, False])
        sub = (lambda: self.schema(depth - 1)) if depth else dict
        s: dict[str, Any] = {}
        for kw in [
            "type", "enum", "const", *_COUNTS, *_BOUNDS, "properties", "required",
            "additionalProperties", "items", "anyOf", "allOf", "description", "format",
        ]:  # fmt: skip
            if r.random() > 0.18:
                continue
            if kw == "type":
                s[kw] = r.choice(_TYPE_NAMES) if r.random() < 0.7 else r.sample(_TYPE_NAMES, r.randint(1, 3))
            elif kw in ("enum", "const"):
                members = [
                    r.choice([None, True, False, r.randint(-2, 2), "x", "ab"]) for _ in range(r.randint(1, 3))
                ]
                s[kw] = members if kw == "enum" else members[0]
            elif kw in _COUNTS:
                s[kw] = r.randint(0, 4)
            elif kw in _BOUNDS:
                s[kw] = r.choice([r.randint(-3, 4), 0.5, 2.5])
            elif kw == "properties":
                s[kw] = {r.choice(_NAMES): sub() for _ in range(r.randint(0, 3))}
            elif kw == "required":
                s[kw] = r.sample([*_NAMES, "z"], r.randint(0, 3))
            elif kw in ("additionalProperties", "items"):
                s[kw] = r.choice([True, False]) if r.random() < 0.4 else sub()
            elif kw in ("anyOf", "allOf"):
                s[kw] = [sub() for _ in range(r.randint(1, 3))]
            else:
                s[kw] = "email" if kw == "format" else "an annotation"
        if "enum" in s:
            s.pop("const", None)
        return s


@pytest.mark.parametrize("seed", range(4))
def test_quick_yes_means_jsonschema_finds_no_error(seed: int) -> None:
    gen = _Gen(seed)
    said_yes = 0
    for _ in range(500):
        schema = gen.schema()
        check = quick_check(schema)
        assert check is not None, schema  # everything generated is inside the part it knows
        validator = Draft202012Validator(schema)
        for _ in range(8):
            value = gen.value()
            if check(value):
                said_yes += 1
                assert not list(validator.iter_errors(value)), (schema, value)
    assert said_yes > 1000  # it did answer "valid" often enough for the test to mean something


@pytest.mark.parametrize(
    ("schema", "valid", "invalid"),
    [
        ({"type": "object", "properties": {"note": {"type": "string"}}}, [{}, {"note": "x"}], [{"note": 1}]),
        (
            {
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
                "additionalProperties": False,
            },
            [{"n": 3}],
            [{}, {"n": True}, {"n": 1.5}, {"n": 1, "m": 2}],
        ),
        ({"enum": ["a", 1, None, True]}, ["a", 1, None, True], ["b", 2, False, 1.5]),
        (
            {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
            [[], ["x", None]],
            [[1]],
        ),
        ({"type": "string", "format": "email"}, ["not an email"], [3]),  # format: an annotation only
    ],
)
def test_quick_check_answers_for_common_shapes(
    schema: dict[str, Any], valid: list[Any], invalid: list[Any]
) -> None:
    check = quick_check(schema)
    assert check is not None
    validator = Draft202012Validator(schema)
    for value in valid:
        assert check(value) and validator.is_valid(value)
    for value in invalid:
        assert not check(value) and not validator.is_valid(value)


def test_a_value_it_is_not_sure_of_is_left_to_the_validator() -> None:
    check = quick_check({"type": "integer", "minimum": 0})
    assert check is not None
    assert not check(1.0)  # an integer to JSON Schema: not certain here, valid to the validator
    assert Draft202012Validator({"type": "integer"}).is_valid(1.0)
    assert not check((1,))  # not a JSON type


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#/$defs/x", "$defs": {"x": {}}},
        {"pattern": "^a"},
        {"oneOf": [{"type": "string"}]},
        {"enum": [1.5]},
        {"enum": [[1]]},
        {"items": [{"type": "string"}]},
        {"patternProperties": {"^a": {}}},
        {"properties": {1: {}}},
        {"$schema": "http://json-schema.org/draft-03/schema#"},
        {"$schema": "http://json-schema.org/draft-04/schema#", "exclusiveMinimum": True, "minimum": 0},
        {"x-vendor": 1},
        {"type": "decimal"},
    ],
)
def test_schemas_outside_its_part_get_no_quick_check(schema: dict[str, Any]) -> None:
    assert quick_check(schema) is None


@pytest.mark.parametrize("cls", [Draft4Validator, Draft7Validator])
def test_older_drafts_mean_the_same_for_its_part(cls: Any) -> None:
    schema = {
        "$schema": cls.META_SCHEMA["$schema"],
        "type": "object",
        "properties": {"n": {"type": "number", "minimum": 1}},
        "required": ["n"],
    }
    check = quick_check(schema)
    assert check is not None
    for value, ok in [({"n": 1}, True), ({"n": 0}, False), ({}, False)]:
        assert check(value) is ok
        assert cls(schema).is_valid(value) is ok


class _Customer(pydantic.BaseModel):
    id: str
    tier: Literal["gold", "silver"] = "silver"
    tags: list[str] = []
    credit: float | None = None


async def _lookup(customer: _Customer, limit: int = 10, note: str | None = None) -> dict[str, Any]:
    return {}


def test_schemas_built_from_type_hints_get_a_quick_check() -> None:
    _, schema = schema_from_function(_lookup)
    validator, check = compiled_schema(schema)
    assert check is not None
    ok = {"customer": {"id": "c1", "tier": "gold", "tags": ["a"], "credit": None}, "limit": 3}
    assert check(ok) and validator.is_valid(ok)
    bad = {"customer": {"id": "c1", "tier": "bronze"}}
    assert not check(bad) and not validator.is_valid(bad)
