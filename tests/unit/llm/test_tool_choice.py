"""`tool_choice` in each provider's wire form, and what a compat server's capabilities change."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from stevora.errors import ProviderError
from stevora.llm.anthropic_provider import AnthropicProvider
from stevora.llm.capabilities import ServerCapabilities
from stevora.llm.messages import (
    LlmRequest,
    Message,
    NamedTool,
    ToolCall,
    ToolChoice,
    ToolSpec,
    tool_choice_of,
    tool_choice_to_json,
)
from stevora.llm.openai_provider import OpenAIProvider
from stevora.llm.scripted_provider import scripted_response
from stevora.settings import Settings

WEATHER = ToolSpec("get_weather", "Weather", {"type": "object", "properties": {"city": {"type": "string"}}})
TIME = ToolSpec("get_time", "Time", {"type": "object", "properties": {}})
TOOL_ROUND = [
    Message.user("Weather in Paris?"),
    Message.assistant(None, [ToolCall("call_1", "get_weather", '{"city":"Paris"}')]),
    Message.tool_result("call_1", '{"temp_c":21}'),
]


def _request(
    choice: ToolChoice = "auto", *, tools: tuple[ToolSpec, ...] = (WEATHER, TIME), **kw: Any
) -> LlmRequest:
    return LlmRequest(model="m", messages=[Message.user("hi")], tools=list(tools), tool_choice=choice, **kw)


@pytest.fixture
async def openai_api() -> AsyncIterator[OpenAIProvider]:
    provider = OpenAIProvider("test", "http://127.0.0.1:9/v1")
    yield provider
    await provider.aclose()


@pytest.fixture
async def compat() -> AsyncIterator[OpenAIProvider]:
    provider = OpenAIProvider("test", "http://127.0.0.1:9/v1", name="llamacpp")
    yield provider
    await provider.aclose()


@pytest.fixture
async def anthropic_api() -> AsyncIterator[AnthropicProvider]:
    provider = AnthropicProvider("test", "http://127.0.0.1:9")
    yield provider
    await provider.aclose()


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("required", "required"),
        ("none", "none"),
        (NamedTool("get_time"), {"type": "function", "function": {"name": "get_time"}}),
    ],
)
def test_openai_sends_each_tool_choice_in_its_documented_form(
    openai_api: OpenAIProvider, choice: ToolChoice, wire: object
) -> None:
    kwargs = openai_api.build_kwargs(_request(choice))
    assert kwargs["tool_choice"] == wire
    assert kwargs["parallel_tool_calls"] is True


def test_openai_auto_is_the_servers_default_and_is_not_sent(openai_api: OpenAIProvider) -> None:
    assert "tool_choice" not in openai_api.build_kwargs(_request("auto"))


def test_tool_choice_is_left_out_of_a_request_without_tools(openai_api: OpenAIProvider) -> None:
    kwargs = openai_api.build_kwargs(_request("required", tools=()))
    assert "tool_choice" not in kwargs and "tools" not in kwargs


@pytest.mark.parametrize(
    ("choice", "parallel", "wire"),
    [
        ("auto", True, None),
        ("auto", False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("required", True, {"type": "any"}),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
        ("none", True, {"type": "none"}),
        ("none", False, {"type": "none"}),
        (NamedTool("get_time"), True, {"type": "tool", "name": "get_time"}),
        (
            NamedTool("get_time"),
            False,
            {"type": "tool", "name": "get_time", "disable_parallel_tool_use": True},
        ),
    ],
)
def test_anthropic_sends_each_tool_choice_with_parallel_use_inside_it(
    anthropic_api: AnthropicProvider, choice: ToolChoice, parallel: bool, wire: object
) -> None:
    kwargs = anthropic_api.build_kwargs(_request(choice, parallel_tool_calls=parallel))
    assert kwargs.get("tool_choice") == wire


def test_openai_api_keeps_null_content_on_a_tool_call_turn(openai_api: OpenAIProvider) -> None:
    messages = openai_api.build_kwargs(LlmRequest(model="gpt-4o", messages=TOOL_ROUND))["messages"]
    assert messages[1]["content"] is None


@pytest.mark.parametrize(("form", "expected"), [("empty", ""), ("null", None)])
def test_compat_tool_call_turn_content_follows_the_servers_capability(form: str, expected: object) -> None:
    provider = OpenAIProvider(
        "k", "http://127.0.0.1:9/v1", name="x", capabilities=ServerCapabilities(tool_call_content=form)
    )  # type: ignore[arg-type]
    assert (
        provider.build_kwargs(LlmRequest(model="m", messages=TOOL_ROUND))["messages"][1]["content"]
        == expected
    )


def test_compat_tool_call_turn_can_leave_content_out() -> None:
    provider = OpenAIProvider(
        "k", "http://127.0.0.1:9/v1", name="x", capabilities=ServerCapabilities(tool_call_content="omit")
    )
    assert "content" not in provider.build_kwargs(LlmRequest(model="m", messages=TOOL_ROUND))["messages"][1]


def test_compat_defaults_send_empty_content_and_no_parallel_parameter(compat: OpenAIProvider) -> None:
    kwargs = compat.build_kwargs(LlmRequest(model="m", messages=TOOL_ROUND, tools=[WEATHER]))
    assert kwargs["messages"][1]["content"] == ""
    assert "parallel_tool_calls" not in kwargs


def test_compat_required_with_one_tool_falls_back_to_naming_it(compat: OpenAIProvider) -> None:
    kwargs = compat.build_kwargs(_request("required", tools=(WEATHER,)))
    assert kwargs["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def test_compat_required_with_several_tools_fails_before_the_request(compat: OpenAIProvider) -> None:
    with pytest.raises(ProviderError) as info:
        compat.build_kwargs(_request("required"))
    assert info.value.code == "TOOL_CHOICE_UNSUPPORTED"
    assert info.value.retryable is False
    assert "llamacpp does not accept toolChoice 'required'" in str(info.value)
    assert "STEVORA_COMPAT_CAPABILITIES" in str(info.value)


def test_compat_none_unsupported_is_sent_as_a_request_without_tools() -> None:
    provider = OpenAIProvider(
        "k",
        "http://127.0.0.1:9/v1",
        name="x",
        capabilities=ServerCapabilities(tool_choice=frozenset()),
    )
    kwargs = provider.build_kwargs(_request("none"))
    assert "tools" not in kwargs and "tool_choice" not in kwargs
    with pytest.raises(ProviderError, match=r"does not accept toolChoice \{'name': 'get_time'\}"):
        provider.build_kwargs(_request(NamedTool("get_time")))


def test_compat_auto_is_left_to_the_server_unless_it_must_be_sent(compat: OpenAIProvider) -> None:
    assert "tool_choice" not in compat.build_kwargs(_request("auto"))
    provider = OpenAIProvider(
        "k", "http://127.0.0.1:9/v1", name="x", capabilities=ServerCapabilities(send_auto=True)
    )
    assert provider.build_kwargs(_request("auto"))["tool_choice"] == "auto"


def test_compat_server_declared_capable_gets_required_and_parallel_as_asked() -> None:
    caps = ServerCapabilities(tool_choice=frozenset({"required"}), parallel_tool_calls=True)
    provider = OpenAIProvider("k", "http://127.0.0.1:9/v1", name="vllm", capabilities=caps)
    kwargs = provider.build_kwargs(_request("required", parallel_tool_calls=False))
    assert kwargs["tool_choice"] == "required"
    assert kwargs["parallel_tool_calls"] is False


def test_capabilities_setting_is_json_by_compat_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "STEVORA_COMPAT_CAPABILITIES",
        '{"vllm": {"tool_choice": ["required"], "tool_call_content": "null"}}',
    )
    caps = Settings().compat_capabilities["vllm"]
    assert caps.tool_choice == {"required"}
    assert caps.tool_call_content == "null"
    assert caps.usage is True  # unset fields keep their defaults


def test_capabilities_reject_unknown_fields_and_values() -> None:
    with pytest.raises(ValueError, match="tool_choices"):
        ServerCapabilities.model_validate({"tool_choices": ["auto"]})
    with pytest.raises(ValueError, match="tool_choice"):
        ServerCapabilities.model_validate({"tool_choice": ["auto"]})  # always allowed, not listed


@pytest.mark.parametrize("value", ["auto", "required", "none", {"name": "get_time"}])
def test_tool_choice_json_round_trip(value: object) -> None:
    assert tool_choice_to_json(tool_choice_of(value)) == value
    request = _request(tool_choice_of(value))
    assert LlmRequest.from_dict(request.to_dict()).tool_choice == request.tool_choice


def test_tool_choice_of_rejects_unknown_modes() -> None:
    with pytest.raises(ValueError, match="invalid tool choice 'any'"):
        tool_choice_of("any")


def test_scripted_provider_honours_tool_choice() -> None:
    assert scripted_response(_request("none")).tool_calls == []
    named = scripted_response(_request(NamedTool("get_time")))
    assert [c.name for c in named.tool_calls] == ["get_time"]
    after_rounds = LlmRequest(model="m", messages=TOOL_ROUND, tools=[WEATHER], tool_choice="required")
    assert [c.name for c in scripted_response(after_rounds).tool_calls] == ["get_weather"]
    assert scripted_response(LlmRequest(model="m", messages=TOOL_ROUND, tools=[WEATHER])).tool_calls == []
