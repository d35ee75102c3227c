import enum
from typing import Annotated, Any, Literal

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel, Field

from stevora.tools import ToolContext, schema_from_function
from stevora.tools.schema import compiled_validator


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Address(BaseModel):
    """A postal address."""

    street: str
    city: str = "Paris"


class Customer(BaseModel):
    name: str
    address: Address
    previous: list[Address] = []


class TreeNode(BaseModel):
    label: str
    children: list["TreeNode"] = []


def _walk(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        return [node, *[d for v in node.values() for d in _walk(v)]]
    if isinstance(node, list):
        return [d for v in node for d in _walk(v)]
    return []


def test_basic_python_types_map_to_json_schema_types() -> None:
    def f(s: str, i: int, x: float, b: bool, ints: list[int], d: dict[str, Any]) -> None: ...

    _, schema = schema_from_function(f)
    props = schema["properties"]
    assert props["s"] == {"type": "string"}
    assert props["i"] == {"type": "integer"}
    assert props["x"] == {"type": "number"}
    assert props["b"] == {"type": "boolean"}
    assert props["ints"] == {"type": "array", "items": {"type": "integer"}}
    assert props["d"]["type"] == "object"
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["s", "i", "x", "b", "ints", "d"]


def test_literal_parameter_becomes_an_enum() -> None:
    def f(unit: Literal["celsius", "fahrenheit"]) -> None: ...

    _, schema = schema_from_function(f)
    assert schema["properties"]["unit"] == {"type": "string", "enum": ["celsius", "fahrenheit"]}


def test_enum_parameter_is_inlined_as_an_enum_of_values() -> None:
    def f(color: Color) -> None: ...

    _, schema = schema_from_function(f)
    assert schema["properties"]["color"]["enum"] == ["red", "blue"]
    assert "$defs" not in schema


def test_parameters_with_defaults_are_not_required_and_keep_the_default() -> None:
    def f(city: str, days: int = 3, note: str | None = None) -> None: ...

    _, schema = schema_from_function(f)
    assert schema["required"] == ["city"]
    assert schema["properties"]["days"] == {"type": "integer", "default": 3}
    assert schema["properties"]["note"]["anyOf"] == [{"type": "string"}, {"type": "null"}]


def test_annotated_field_and_plain_string_metadata_become_descriptions() -> None:
    def f(
        city: Annotated[str, Field(description="City name")],
        country: Annotated[str, "ISO country code"],
        days: int = Field(2, description="Days ahead"),
    ) -> None: ...

    _, schema = schema_from_function(f)
    props = schema["properties"]
    assert props["city"] == {"type": "string", "description": "City name"}
    assert props["country"] == {"type": "string", "description": "ISO country code"}
    assert props["days"] == {"type": "integer", "default": 2, "description": "Days ahead"}


def test_docstring_gives_the_description_and_args_section_describes_parameters() -> None:
    def f(city: str, days: int = 1, explicit: Annotated[str, "from the hint"] = "") -> None:
        """Get the weather
        for a city.

        Longer explanation that is not part of the description.

        Args:
            city: The city to look up.
            days (int): How many days
                ahead to forecast.
            explicit: from the docstring, overridden.

        Returns:
            A forecast.
        """

    description, schema = schema_from_function(f)
    assert description == "Get the weather for a city."
    props = schema["properties"]
    assert props["city"]["description"] == "The city to look up."
    assert props["days"]["description"] == "How many days ahead to forecast."
    assert props["explicit"]["description"] == "from the hint"


def test_function_without_docstring_has_an_empty_description() -> None:
    def f(x: int) -> None: ...

    assert schema_from_function(f)[0] == ""


def test_nested_pydantic_models_are_inlined_without_any_ref() -> None:
    def f(customer: Customer, shipping: Address | None = None) -> None: ...

    _, schema = schema_from_function(f)
    nodes = _walk(schema)
    assert not any("$ref" in n or "$defs" in n for n in nodes)
    customer = schema["properties"]["customer"]
    assert customer["required"] == ["name", "address"]
    assert customer["properties"]["address"]["properties"]["street"] == {"type": "string"}
    assert customer["properties"]["previous"]["items"]["description"] == "A postal address."
    Draft202012Validator.check_schema(schema)
    ok = {"customer": {"name": "Ann", "address": {"street": "1 Rue"}}}
    assert Draft202012Validator(schema).is_valid(ok)
    assert not Draft202012Validator(schema).is_valid({"customer": {"name": "Ann", "address": {}}})


def test_recursive_model_keeps_a_resolvable_definition() -> None:
    def f(tree: TreeNode) -> None: ...

    _, schema = schema_from_function(f)
    assert set(schema["$defs"]) == {"TreeNode"}
    validator = Draft202012Validator(schema)
    assert validator.is_valid({"tree": {"label": "a", "children": [{"label": "b"}]}})
    assert not validator.is_valid({"tree": {"label": "a", "children": [{"children": []}]}})


def test_generated_titles_are_stripped_but_a_parameter_named_title_is_kept() -> None:
    def f(title: str, customer: Customer) -> None: ...

    _, schema = schema_from_function(f)
    assert schema["properties"]["title"] == {"type": "string"}
    assert not any(isinstance(n.get("title"), str) for n in _walk(schema))


def test_unannotated_parameter_accepts_any_value() -> None:
    def f(anything, count=0) -> None:  # type: ignore[no-untyped-def]
        ...

    _, schema = schema_from_function(f)
    assert schema["properties"]["anything"] == {}
    assert "type" not in schema["properties"]["count"]
    assert schema["required"] == ["anything"]


def test_tool_context_parameter_is_left_out_of_the_schema() -> None:
    def f(query: str, ctx: ToolContext) -> None: ...

    _, schema = schema_from_function(f)
    assert list(schema["properties"]) == ["query"]
    assert schema["required"] == ["query"]


def test_parameter_names_that_shadow_basemodel_attributes_are_supported() -> None:
    def f(json: str, schema: dict[str, Any], model_config: int = 0) -> None: ...

    _, built = schema_from_function(f)
    assert list(built["properties"]) == ["json", "schema", "model_config"]


def test_function_with_var_kwargs_allows_additional_properties() -> None:
    def f(x: int, **extra: Any) -> None: ...

    _, schema = schema_from_function(f)
    assert "additionalProperties" not in schema
    assert list(schema["properties"]) == ["x"]


def test_unresolvable_type_hint_is_a_clear_type_error() -> None:
    def f(x: "NoSuchType") -> None:  # type: ignore[name-defined] # noqa: F821
        ...

    with pytest.raises(TypeError, match="Cannot resolve the type hints"):
        schema_from_function(f)


def test_equal_schemas_share_one_compiled_validator() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    first = compiled_validator(schema)
    assert compiled_validator(schema) is first
    assert compiled_validator({"properties": {"q": {"type": "string"}}, "type": "object"}) is first
    assert isinstance(first, Draft202012Validator)
