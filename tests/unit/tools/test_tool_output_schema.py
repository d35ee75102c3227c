"""`@tool` return annotations as output schemas: pydantic models and both kinds of `TypedDict`
(`typing` and `typing_extensions`) on every supported Python, or a clear error at registration.

This module uses `from __future__ import annotations` on purpose: string annotations are what
Python 3.11's `typing.TypedDict` gets wrong about `NotRequired`.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import pytest
import typing_extensions

from stevora.tools import ToolRegistry
from stevora.tools.invoke import OutputLimits, invoke_tool
from stevora.tools.schema import compiled_validator
from tests.unit.tools.test_tool_invoke import CONTEXT


class Address(typing.TypedDict):
    city: str


class Order(typing.TypedDict):
    id: int
    addresses: list[Address]
    note: typing.NotRequired[str | None]


class Receipt(typing_extensions.TypedDict):
    total: float
    order: Order  # a typing.TypedDict inside a typing_extensions one


class Partial(typing_extensions.TypedDict, total=False):
    hint: str


class Opaque:
    """Not a type pydantic can describe."""


class WithOpaque(typing.TypedDict):
    thing: Opaque


def _output_schema(registry: ToolRegistry, name: str) -> dict[str, Any]:
    entry = registry.get(name)
    assert entry is not None and entry.output_schema is not None, f"{name} has no output schema"
    return entry.output_schema


def test_a_typing_typeddict_return_gives_an_output_schema() -> None:
    registry = ToolRegistry()

    @registry.tool
    def get_order(order_id: int) -> Order:
        return {"id": order_id, "addresses": []}

    schema = _output_schema(registry, "get_order")
    validator = compiled_validator(schema)
    assert sorted(schema["required"]) == ["addresses", "id"]  # NotRequired stays optional
    assert validator.is_valid({"id": 1, "addresses": [{"city": "Lyon"}]})
    assert validator.is_valid({"id": 1, "addresses": [], "note": None})
    assert not validator.is_valid({"id": "one", "addresses": []})
    assert not validator.is_valid({"id": 1, "addresses": [{"town": "Lyon"}]})  # nested TypedDict checked
    assert not validator.is_valid({"addresses": []})


def test_a_typing_extensions_typeddict_return_gives_an_output_schema() -> None:
    registry = ToolRegistry()

    @registry.tool
    def receipt() -> Receipt:
        return {"total": 1.0, "order": {"id": 1, "addresses": []}}

    @registry.tool
    def partial() -> Partial:
        return {}

    validator = compiled_validator(_output_schema(registry, "receipt"))
    assert validator.is_valid({"total": 2.5, "order": {"id": 1, "addresses": []}})
    assert not validator.is_valid({"total": 2.5, "order": {"id": 1}})
    assert not validator.is_valid({"total": "lots", "order": {"id": 1, "addresses": []}})
    partial_validator = compiled_validator(_output_schema(registry, "partial"))
    assert partial_validator.is_valid({}) and not partial_validator.is_valid({"hint": 3})


def test_an_annotated_typeddict_return_gives_its_schema() -> None:
    registry = ToolRegistry()

    @registry.tool
    def described() -> typing.Annotated[Address, "Where it goes"]:
        return {"city": "Nice"}

    assert not compiled_validator(_output_schema(registry, "described")).is_valid({"city": 1})


def test_a_return_type_without_a_schema_is_a_registration_error_naming_the_tool() -> None:
    registry = ToolRegistry()

    def opaque() -> WithOpaque:
        return {"thing": Opaque()}

    with pytest.raises(TypeError, match=r"Tool 'fetch_thing'.*output schema.*WithOpaque"):
        registry.tool(name="fetch_thing")(opaque)
    assert "fetch_thing" not in registry


async def test_a_result_breaking_a_typeddict_schema_is_a_failed_call() -> None:
    registry = ToolRegistry()

    @registry.tool
    def get_order(order_id: int) -> Order:
        return {"id": "not a number", "addresses": []}  # type: ignore[typeddict-item]

    context = dataclasses.replace(CONTEXT, _state_updates={})
    outcome = await invoke_tool(
        registry, "get_order", {"order_id": 7}, context=context, timeout_s=5,
        limits=OutputLimits(max_output_bytes=100_000),
    )  # fmt: skip
    assert (outcome.status, outcome.error_code) == ("failed", "TOOL_OUTPUT_INVALID")
    assert outcome.error is not None and "id" in outcome.error
    assert "error" in outcome.result_text
