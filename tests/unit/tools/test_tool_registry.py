from typing import Any

import pytest

import stevora.tools.registry as registry_module
from stevora.tools import RegisteredTool, ToolContext, ToolRegistry, register_tool, registerTool, tool


@pytest.fixture
def fresh_default_registry(monkeypatch: pytest.MonkeyPatch) -> ToolRegistry:
    fresh = ToolRegistry()
    monkeypatch.setattr(registry_module, "default_registry", fresh)
    return fresh


@pytest.mark.parametrize("bad", ["", "has space", "a" * 65, "dots.not.allowed", "trailing\n", "é"])
def test_tool_names_outside_the_allowed_pattern_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="Invalid tool name"):
        ToolRegistry().register(bad, lambda input: None)


def test_registering_the_same_name_again_replaces_the_handler() -> None:
    registry = ToolRegistry()

    def first(input: dict[str, Any]) -> str:
        return "first"

    def second(input: dict[str, Any]) -> str:
        return "second"

    registry.register("lookup", first)
    registry.register("lookup", second)
    entry = registry.get("lookup")
    assert entry is not None and entry.handler is second
    assert registry.names() == ["lookup"]


def test_register_defaults_to_any_object_schema_and_docstring_description() -> None:
    async def search(input: dict[str, Any]) -> list[str]:
        """Search the knowledge base.

        Details that stay out of the description.
        """
        return []

    entry = ToolRegistry().register("search", search)
    assert entry.parameters == {"type": "object"}
    assert entry.description == "Search the knowledge base."
    assert entry.is_async and entry.call_style == "input" and not entry.wants_context


def test_register_keeps_explicit_description_schema_and_timeout() -> None:
    params = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    registry = ToolRegistry()
    entry = registry.register("s", lambda input: None, description="d", parameters=params, timeout_ms=500)
    assert entry.as_definition() == {"name": "s", "description": "d", "parameters": params}
    assert entry.timeout_ms == 500 and not entry.is_async


def test_register_rejects_an_invalid_or_non_object_parameters_schema() -> None:
    registry = ToolRegistry()
    with pytest.raises(ValueError, match="invalid parameters schema"):
        registry.register("t", lambda input: None, parameters={"type": "object", "properties": 3})
    with pytest.raises(ValueError, match="type 'object'"):
        registry.register("t", lambda input: None, parameters={"type": "string"})
    assert "t" not in registry


@pytest.mark.parametrize("bad", [0, -5, 1.5, True])
def test_timeout_ms_must_be_a_positive_integer(bad: Any) -> None:
    with pytest.raises(ValueError, match="timeout_ms"):
        ToolRegistry().register("t", lambda input: None, timeout_ms=bad)


def test_handler_with_a_second_positional_parameter_wants_the_context() -> None:
    registry = ToolRegistry()

    async def one(input: dict[str, Any]) -> None: ...
    async def two(input: dict[str, Any], ctx: Any) -> None: ...
    def keyword(input: dict[str, Any], *, context: ToolContext) -> None: ...

    assert not registry.register("one", one).wants_context
    assert registry.register("two", two).wants_context
    assert registry.register("keyword", keyword).wants_context


def test_tool_decorator_works_bare_and_configured_and_returns_the_function() -> None:
    registry = ToolRegistry()

    def get_weather(city: str, days: int = 1) -> str:
        """Weather for a city."""
        return f"{city}:{days}"

    async def lookup(query: str, ctx: ToolContext) -> str:
        return query

    assert registry.tool(get_weather) is get_weather
    assert registry.tool(name="find", description="Find things", timeout_ms=100)(lookup) is lookup
    assert get_weather("Oslo") == "Oslo:1"

    weather = registry.get("get_weather")
    assert weather is not None
    assert weather.call_style == "kwargs" and not weather.is_async and not weather.wants_context
    assert weather.description == "Weather for a city."
    assert weather.parameters["required"] == ["city"]
    find = registry.get("find")
    assert find is not None
    assert find.is_async and find.wants_context and find.timeout_ms == 100
    assert find.description == "Find things"
    assert "query" in find.parameters["properties"] and "ctx" not in find.parameters["properties"]
    assert registry.names() == ["find", "get_weather"]
    assert "find" in registry and "lookup" not in registry and len(registry) == 2


def test_copy_is_independent_of_the_original() -> None:
    registry = ToolRegistry()
    registry.register("a", lambda input: None)
    clone = registry.copy()
    clone.register("b", lambda input: None)
    assert registry.names() == ["a"]
    assert clone.names() == ["a", "b"]
    assert clone.get("a") is registry.get("a")


def test_module_level_helpers_register_on_the_default_registry(fresh_default_registry: ToolRegistry) -> None:
    def handler(input: dict[str, Any]) -> None: ...

    assert isinstance(register_tool("one", handler), RegisteredTool)
    registerTool("two", handler, description="second")

    @tool
    def three(x: int) -> int:
        return x

    @tool(name="four")
    def renamed(x: int) -> int:
        return x

    assert fresh_default_registry.names() == ["four", "one", "three", "two"]
    assert three(2) == 2
    assert registerTool is register_tool


def test_hand_built_registered_tool_gets_a_default_binding() -> None:
    def handler(input: dict[str, Any], ctx: Any) -> None: ...

    entry = RegisteredTool(
        name="t",
        description="",
        parameters={"type": "object"},
        handler=handler,
        is_async=False,
        wants_context=True,
        call_style="input",
        timeout_ms=None,
    )
    assert entry.bind is not None
    context = ToolContext("k", "run", "ws", "step", "s", 0, 0, "call")
    args, kwargs = entry.bind({"a": 1}, context)
    assert args == ({"a": 1}, context) and kwargs == {}
